//go:build race

package gate

// raceEnabled: sync.Pool drops items at random under -race, so allocation
// counts are meaningless there.
const raceEnabled = true
