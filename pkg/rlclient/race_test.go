//go:build race

package rlclient

const raceEnabled = true
