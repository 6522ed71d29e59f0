package admission

import (
	"testing"
	"time"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) Now() time.Time          { return c.t }
func (c *fakeClock) Advance(d time.Duration) { c.t = c.t.Add(d) }

func TestLocalLimiterBurstRefillAllOrNothing(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	l := NewLocalLimiter(clk.Now, 0)
	a := LocalZone{Zone: "per_client", Bucket: []byte("client:1"), Rate: 2, PeriodMs: 1000, Burst: 3, Cost: 1}
	b := LocalZone{Zone: "global", Bucket: []byte("all"), Rate: 100, PeriodMs: 1000, Burst: 0, Cost: 1}
	out := make([]ZoneState, 2)
	for i := 0; i < 3; i++ {
		if !l.Take([]LocalZone{a, b}, out) {
			t.Fatalf("request %d denied within burst", i)
		}
	}
	if out[0].Remaining != 0 || out[1].Remaining != 97 {
		t.Fatalf("remaining %+v", out)
	}
	if l.Take([]LocalZone{a, b}, out) {
		t.Fatal("4th request allowed beyond burst 3")
	}
	if out[0].RetryAfterMs != 500 || out[1].RetryAfterMs != 0 || out[1].Remaining != 97 {
		t.Fatalf("deny state %+v (want retry 500ms on a, b untouched at 97)", out)
	}
	// The deny consumed nothing from b: 97 requests fit b alone.
	for i := 0; i < 97; i++ {
		if !l.Take([]LocalZone{b}, out[:1]) {
			t.Fatalf("b request %d denied: the deny consumed from b", i)
		}
	}
	clk.Advance(500 * time.Millisecond)
	if !l.Take([]LocalZone{a}, out[:1]) {
		t.Fatal("refill of one token after 500ms at 2/s not seen")
	}
	if l.Take([]LocalZone{a}, out[:1]) {
		t.Fatal("second token appeared from nowhere")
	}
	// Another bucket of the same zone is independent.
	other := a
	other.Bucket = []byte("client:2")
	if !l.Take([]LocalZone{other}, out[:1]) {
		t.Fatal("other client's bucket not independent")
	}
}

func TestLocalLimiterBounded(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	l := NewLocalLimiter(clk.Now, 4)
	out := make([]ZoneState, 1)
	for i := 0; i < 20; i++ {
		z := LocalZone{Zone: "z", Bucket: []byte{byte('a' + i)}, Rate: 1, PeriodMs: 1000, Cost: 1}
		l.Take([]LocalZone{z}, out)
		if l.Len() > 4 {
			t.Fatalf("%d buckets held, max 4", l.Len())
		}
	}
}
