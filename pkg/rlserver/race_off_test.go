//go:build !race

package rlserver

const raceEnabled = false
