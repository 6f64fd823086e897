package modproxy_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/modproxy"
)

// A module outside the repository uses sluice the way the README says: `go get` the library
// (pkg/outbox, pkg/inbox) and the CDK constructs (infra), and the module builds; `go install
// .../cmd/sluice@latest` installs the CLI (go install refuses a module with replace directives). The modules come from a file-system proxy built from the working tree,
// in front of the machine's module cache (third-party modules); GOWORK=off, so go.work plays no
// part, and a module cache of the test's own from which sluice's modules are removed first, so
// nothing of ours from an earlier run is reused.
func TestOutsideModuleBuildsAndInstalls(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the CDK constructs outside the repository (about a minute)")
	}
	t.Parallel()
	root := repoRoot(t)
	proxy := t.TempDir()
	mods, err := modproxy.Build(proxy, root, modproxy.Version)
	require.NoError(t, err)
	paths := map[string]bool{}
	for _, m := range mods {
		paths[m.Path] = true
	}
	for _, want := range []string{"github.com/sluicehq/sluice", "github.com/sluicehq/sluice/cmd/sluice", "github.com/sluicehq/sluice/infra"} {
		require.True(t, paths[want], "go.work serves %s", want)
	}

	// Third-party modules: the machine's module cache, served as a proxy (its download
	// directory has the proxy layout), then the proxy the machine already uses. Checksums:
	// our modules are in no checksum database (GONOSUMDB, as a public release will be in
	// sum.golang.org); the third-party ones were verified when they entered the machine's cache,
	// which is all this test reads when that cache is complete (`make deps`), so it runs offline.
	machineCache := goEnv(t, "GOMODCACHE")
	goproxy := "file://" + filepath.ToSlash(proxy) + ",file://" + filepath.ToSlash(filepath.Join(machineCache, "cache", "download"))
	if p := goEnv(t, "GOPROXY"); p != "" && p != "off" {
		goproxy += "," + p
	}
	outside := t.TempDir()
	gobin := filepath.Join(outside, "bin")
	// The module cache outlives the test: the third-party modules it holds never change, and
	// unpacking the CDK and the AWS SDK again (some 800 MB) would be most of the test's time.
	// Ours are removed, since every run serves new contents under the same version. It is kept
	// outside the repository (grep -r stays fast) and per checkout (worktrees run it at once).
	modcache := outsideModCache(t, root)
	for _, dir := range []string{filepath.Join(modcache, "github.com", "sluicehq"), filepath.Join(modcache, "cache", "download", "github.com", "sluicehq")} {
		require.NoError(t, os.RemoveAll(dir))
	}
	env := append(os.Environ(),
		"GOWORK=off", "GOTOOLCHAIN=local", "GOPROXY="+goproxy, "GOSUMDB=off",
		"GONOSUMDB=github.com/sluicehq/sluice", "GOPRIVATE=", "GONOPROXY=",
		"GOMODCACHE="+modcache, "GOBIN="+gobin,
		// -trimpath keeps the build cache's keys free of the module cache's path, so what the
		// CDK's packages compiled to is shared with other checkouts; -modcacherw lets the next
		// run remove our modules from the module cache.
		"GOFLAGS=-modcacherw -trimpath",
		// The go command indexes a module cache's directories once per module version (in the
		// build cache, taking them for immutable): ours change under the same version every
		// run, and a stale index left out files added since (undefined names at build time).
		"GODEBUG=goindex=0",
	)
	run := func(dir string, args ...string) string {
		t.Helper()
		start := time.Now()
		cmd := exec.Command("go", args...)
		cmd.Dir, cmd.Env = dir, env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		require.NoError(t, cmd.Run(), "go %s:\n%s", strings.Join(args, " "), out.String())
		t.Logf("go %s: %s", strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
		return out.String()
	}

	app := filepath.Join(outside, "app")
	require.NoError(t, os.MkdirAll(app, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(app, "main.go"), []byte(outsideMain), 0o644))
	run(app, "mod", "init", "example.com/outside")
	// The README's lines: go get the library and the constructs (@latest: the release the proxy
	// lists).
	run(app, "get", "github.com/sluicehq/sluice@latest", "github.com/sluicehq/sluice/infra@latest")
	run(app, "mod", "tidy")
	gomod, err := os.ReadFile(filepath.Join(app, "go.mod"))
	require.NoError(t, err)
	require.Contains(t, string(gomod), "github.com/sluicehq/sluice "+modproxy.Version)
	require.Contains(t, string(gomod), "github.com/sluicehq/sluice/infra "+modproxy.Version)
	run(app, "build", "-o", filepath.Join(outside, "outside"), ".")
	out, err := exec.Command(filepath.Join(outside, "outside")).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Equal(t, "outbox, inbox and infra linked\n", string(out))

	// The README's install line, run from outside any module.
	run(outside, "install", "github.com/sluicehq/sluice/cmd/sluice@latest")
	help, err := exec.Command(filepath.Join(gobin, "sluice"), "--help").CombinedOutput()
	require.NoError(t, err, "%s", help)
	for _, cmd := range []string{"migrate", "relay", "status"} {
		require.Contains(t, string(help), cmd, "the installed CLI lists its commands")
	}
}

// outsideMain uses a name from each package, so each is compiled and linked.
const outsideMain = `package main

import (
	"fmt"

	"github.com/sluicehq/sluice/infra"
	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/outbox"
)

var (
	_ = outbox.Write
	_ = inbox.Decode[struct{}]
	_ = infra.NewConsumer
)

func main() { fmt.Println("outbox, inbox and infra linked") }
`

// outsideModCache is the test's module cache for the checkout at root:
// <user cache dir>/sluice-outside-module/<hash of root>.
func outsideModCache(t *testing.T, root string) string {
	t.Helper()
	base, err := os.UserCacheDir()
	require.NoError(t, err)
	sum := sha256.Sum256([]byte(root))
	return filepath.Join(base, "sluice-outside-module", hex.EncodeToString(sum[:6]))
}

func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	require.NoError(t, err, "the test builds the proxy from a git working tree")
	return strings.TrimSpace(string(out))
}

func goEnv(t *testing.T, name string) string {
	t.Helper()
	out, err := exec.Command("go", "env", name).Output()
	require.NoError(t, err)
	return strings.TrimSpace(string(out))
}
