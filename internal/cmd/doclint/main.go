// Command doclint fails when the doc of a general exported name names some destinations but not
// all (see internal/doclint). `make lint` runs it over the public packages:
//
//	go run ./internal/cmd/doclint ./pkg/outbox ./pkg/inbox ...
package main

import (
	"fmt"
	"os"

	"github.com/sluicehq/sluice/internal/doclint"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: doclint PACKAGE_DIR...")
		os.Exit(2)
	}
	failed := false
	for _, dir := range os.Args[1:] {
		found, err := doclint.Dir(dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, "doclint:", err)
			os.Exit(2)
		}
		for _, f := range found {
			fmt.Println(f)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}
