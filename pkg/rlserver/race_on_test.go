//go:build race

package rlserver

// raceEnabled: the race detector adds allocations, so alloc tests skip.
const raceEnabled = true
