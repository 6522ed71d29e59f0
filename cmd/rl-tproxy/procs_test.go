package main

import (
	"io"
	"log/slog"
	"runtime"
	"testing"
)

func TestLoopsAndSpareP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		procs, flag         int
		wantLoops, wantProc int
	}{
		{1, 0, 1, 2}, // one per CPU: one loop, one P to spare
		{4, 0, 4, 5}, // the same on four
		{2, 3, 3, 4}, // more loops than Ps
		{8, 2, 2, 8}, // Ps to spare already: unchanged
		{3, 2, 2, 3}, // exactly one to spare
		{2, 2, 2, 3}, // as many loops as Ps
		{1, 16, 16, 17},
	} {
		runtime.GOMAXPROCS(tc.procs)
		loops := loopsAndSpareP(tc.flag, log)
		if got := runtime.GOMAXPROCS(0); loops != tc.wantLoops || got != tc.wantProc {
			t.Errorf("GOMAXPROCS %d, --event-loops %d: %d loops, GOMAXPROCS %d; want %d, %d",
				tc.procs, tc.flag, loops, got, tc.wantLoops, tc.wantProc)
		}
	}
}
