//go:build race

package hook

// raceEnabled: sync.Pool drops items at random under -race, so allocation
// counts are meaningless there.
const raceEnabled = true
