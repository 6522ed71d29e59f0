package main

import "io"

func init() {
	register("ratelimitly-server", "run a RateLimitly-compatible UDP server", runServer)
}

// runServer is replaced when its capability lands.
func runServer(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("ratelimitly-server", "ratelimitly-server --listen ADDR --credentials FILE [--admin ADDR] [--workers N]", "Runs a RateLimitly-compatible server (wire v1) on a UDP address.", stderr)
	fs.String("listen", "", "UDP address to listen on")
	if done, code := parseFlags(fs, args, stdout); done {
		return code
	}
	return notImplemented("ratelimitly-server", stderr)
}
