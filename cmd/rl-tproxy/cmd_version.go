package main

import (
	"fmt"
	"io"
	"runtime"
)

func init() {
	register("version", "print the version, commit and Go version", runVersion)
}

func runVersion(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("version", "version", "Prints the version, the commit it was built from and the Go version.", stderr)
	if done, code := parseFlags(fs, args, stdout); done {
		return code
	}
	fmt.Fprintf(stdout, "rl-tproxy %s (commit %s, %s %s/%s)\n", version, commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return exitOK
}
