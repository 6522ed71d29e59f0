package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// newFlagSet returns a flag set that reports errors instead of exiting and
// prints a usage line plus the flag defaults on --help.
func newFlagSet(name, synopsis, description string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintf(out, "Usage: rl-tproxy %s\n\n%s\n", synopsis, description)
		hasFlags := false
		fs.VisitAll(func(*flag.Flag) { hasFlags = true })
		if hasFlags {
			fmt.Fprintln(out, "\nFlags:")
			fs.PrintDefaults()
		}
	}
	return fs
}

// parseFlags parses args. When it returns done, the caller returns code:
// exitOK after --help (printed to stdout), exitInvalid after a flag error.
func parseFlags(fs *flag.FlagSet, args []string, stdout io.Writer) (done bool, code int) {
	// The flag package prints its own message and the usage on any error;
	// silence it and print once, to the right stream.
	errOut := fs.Output()
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.SetOutput(errOut)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(stdout)
		fs.Usage()
		fs.SetOutput(errOut)
		return true, exitOK
	case err != nil:
		fmt.Fprintf(errOut, "rl-tproxy %s: %v\n", fs.Name(), err)
		fs.Usage()
		return true, exitInvalid
	}
	return false, exitOK
}
