// Package exampletest runs the long-running examples' built binaries in their tests: build,
// start, read the health address from the start-up log line, wait for a condition.
package exampletest

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// Build compiles the package in the current directory (the example under test) into a
// temporary directory and returns the binary's path.
func Build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "example")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

// Start runs bin with env and returns it with its health endpoint's address, read from the log
// line whose msg is started (JSON on stderr, with a "health" attribute). The process is killed
// when the test ends if it still runs.
func Start(t *testing.T, bin string, env []string, started string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = env
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	lines := bufio.NewScanner(stderr)
	for lines.Scan() {
		var rec struct{ Msg, Health string }
		if json.Unmarshal(lines.Bytes(), &rec) == nil && rec.Msg == started {
			go func() {
				for lines.Scan() { // keep draining, so the process never blocks on a full pipe
				}
			}()
			return cmd, rec.Health
		}
	}
	t.Fatalf("the example exited before it logged %q: %v", started, cmd.Wait())
	return nil, ""
}

// Status returns the HTTP status of GET http://addr/path, or 0 when nothing answers.
func Status(addr, path string) int {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
