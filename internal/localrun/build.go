package localrun

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
)

// RIEModule is the pinned runtime interface emulator, installed into <root>/.cache/bin.
const RIEModule = "github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie@v0.0.0-20261030222936-bef5c4ba774d"

// Functions are the Lambdas the local stack runs: each name's package, built into
// <dir>/<name>/bootstrap. The relay is the deployed one; the consumer is the demo's ledger
// (examples/ledger), since the deployed skeleton (lambdas/consumer) applies nothing the demo
// could verify.
var Functions = map[string]string{
	RelayFunction:    "./lambdas/relay",
	ConsumerFunction: "./examples/ledger",
	SkeletonFunction: "./lambdas/consumer",
}

// The names of the local stack's functions in Functions.
const (
	RelayFunction    = "relay"
	ConsumerFunction = "ledger"
	// SkeletonFunction is the deployed consumer skeleton (lambdas/consumer), which a stack
	// runs instead of the ledger with StackOptions.Consumer.
	SkeletonFunction = "consumer"
)

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

// BuildLambdas builds each of names (keys of Functions; all of them when none is given) for this
// machine into <dir>/<name>/bootstrap, with the same tags as the deployed arm64 binaries, and
// returns dir.
func BuildLambdas(ctx context.Context, root, dir string, names ...string) (string, error) {
	if len(names) == 0 {
		for n := range Functions {
			names = append(names, n)
		}
		sort.Strings(names)
	}
	for _, n := range names {
		pkg, ok := Functions[n]
		if !ok {
			return "", fmt.Errorf("localrun: no function %q to build", n)
		}
		out := filepath.Join(dir, n, "bootstrap")
		cmd := exec.CommandContext(ctx, "go", "build", "-tags", "lambda.norpc", "-trimpath", "-o", out, pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+runtime.GOOS, "GOARCH="+runtime.GOARCH)
		if b, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("build %s for this machine: %w: %s", pkg, err, b)
		}
	}
	return dir, nil
}
