package h2proxy

import "testing"

// TestIdleDecide: what ends a stream, at a given time: a write stalled
// for the timeout; a body read waiting that long with no response progress
// either; nothing while the response flows (a bidirectional stream whose
// client sends nothing) or while nothing waits on the client.
func TestIdleDecide(t *testing.T) {
	const idle = 100
	for _, tc := range []struct {
		name                string
		writing, reading    bool
		lastWrite, lastRead int64
		now                 int64
		rule                string
		next                int64
	}{
		{"idle, nothing waits", false, false, 0, 0, 500, "", 100},
		{"write stalled", true, false, 0, 0, 100, "send-timeout", 0},
		{"write not yet stalled", true, false, 50, 0, 100, "", 150},
		{"body stalled", false, true, 0, 0, 100, "body-timeout", 0},
		{"body read recently", false, true, 0, 60, 100, "", 160},
		{"body stalled, response flows", false, true, 90, 0, 150, "", 190},
		{"body and response stalled", false, true, 90, 0, 190, "body-timeout", 0},
		{"write stalled while body waits", true, true, 0, 90, 100, "send-timeout", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &idleWatch{idle: idle}
			w.writing.Store(tc.writing)
			w.lastWrite.Store(tc.lastWrite)
			w.body = &bodyCount{}
			w.body.reading.Store(tc.reading)
			w.body.lastRead.Store(tc.lastRead)
			rule, next := w.decide(tc.now)
			if rule != tc.rule || (rule == "" && next != tc.next) {
				t.Fatalf("decide(%d) = %q, %d; want %q, %d", tc.now, rule, next, tc.rule, tc.next)
			}
		})
	}
}
