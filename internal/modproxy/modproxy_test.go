package modproxy

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A module's zip holds its own files: not those of a module nested in its directory.
func TestOwnFilesLeaveNestedModulesOut(t *testing.T) {
	t.Parallel()
	files := []string{"go.mod", "pkg/outbox/write.go", "cmd/sluice/go.mod", "cmd/sluice/main.go",
		"cmd/sluice/internal/cli/cli.go", "cmdline/x.go", "infra/go.mod", "infra/outbox.go"}
	dirs := []string{".", "cmd/sluice", "infra"}
	require.Equal(t, []string{"go.mod", "pkg/outbox/write.go", "cmdline/x.go"}, ownFiles(".", files, dirs))
	require.Equal(t, []string{"cmd/sluice/go.mod", "cmd/sluice/main.go", "cmd/sluice/internal/cli/cli.go"}, ownFiles("cmd/sluice", files, dirs))
}
