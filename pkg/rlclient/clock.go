package rlclient

import "time"

// Clock is the client's time source. Every deadline (request rounds,
// discovery refresh, last-known-good expiry) and every wire timestamp comes
// from it, so tests can drive the engine with a manual clock.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
}

// Timer is a resettable one-shot timer of a Clock. ResetAt takes an
// absolute deadline (so a clock that moves between computing and arming a
// deadline cannot push it later). ResetAt and Stop follow the Go 1.23+
// time.Timer semantics: no stale value is received after them.
type Timer interface {
	C() <-chan time.Time
	ResetAt(at time.Time)
	Stop()
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time  { return t.t.C }
func (t realTimer) ResetAt(at time.Time) { t.t.Reset(time.Until(at)) }
func (t realTimer) Stop()                { t.t.Stop() }
