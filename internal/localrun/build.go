package localrun

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
)

// RIEModule is the pinned runtime interface emulator, installed into <root>/.cache/bin.
const RIEModule = "github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie@v0.0.0-20261030222936-bef5c4ba774d"

// Functions are the Lambdas the local stack runs, by directory under lambdas/.
var Functions = []string{"relay", "consumer"}

// EnsureRIE returns the path of the emulator binary, installing the pinned version with
// `go install` when it is missing (`make deps` normally did that already).
func EnsureRIE(ctx context.Context, root string) (string, error) {
	bin := filepath.Join(root, ".cache", "bin", "aws-lambda-rie")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	cmd := exec.CommandContext(ctx, "go", "install", RIEModule)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOBIN="+filepath.Dir(bin), "GOFLAGS=-mod=mod")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("install the Lambda runtime interface emulator (%s): %w: %s", RIEModule, err, out)
	}
	return bin, nil
}

// BuildLambdas builds each of names (lambdas/<name>) for this machine into <dir>/<name>/bootstrap,
// with the same tags as the deployed arm64 binaries, and returns dir.
func BuildLambdas(ctx context.Context, root, dir string, names ...string) (string, error) {
	if len(names) == 0 {
		names = Functions
	}
	for _, n := range names {
		out := filepath.Join(dir, n, "bootstrap")
		cmd := exec.CommandContext(ctx, "go", "build", "-tags", "lambda.norpc", "-trimpath", "-o", out, "./lambdas/"+n)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+runtime.GOOS, "GOARCH="+runtime.GOARCH)
		if b, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("build lambdas/%s for this machine: %w: %s", n, err, b)
		}
	}
	return dir, nil
}
