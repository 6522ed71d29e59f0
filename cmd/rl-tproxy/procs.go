package main

import (
	"log/slog"
	"runtime"
)

// loopsAndSpareP resolves --event-loops (0: one per P the runtime starts
// with) and raises GOMAXPROCS to one above the loops when it is not
// already: a loop that waits for its next turn inside the kernel keeps its
// P (cheaper one request at a time than parking, see pkg/evloop), and
// does so only while a P is left for the process's goroutines (HTTP/2
// connections, admission answers to goroutines, the admin listener).
// The extra P costs nothing while those goroutines are idle.
func loopsAndSpareP(loops int, log *slog.Logger) int {
	procs := runtime.GOMAXPROCS(0)
	if loops == 0 {
		loops = procs
	}
	if procs <= loops {
		runtime.GOMAXPROCS(loops + 1)
		log.Debug("GOMAXPROCS raised one above the event loops", "event_loops", loops, "gomaxprocs", loops+1, "was", procs)
	}
	return loops
}
