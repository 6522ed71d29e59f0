//go:build !race

package hook

const raceEnabled = false
