package admission

import (
	"math"
	"sync"
	"time"
)

// LocalZone is one resource of a request as the local fallback sees it:
// the zone's name, its rendered bucket and its limits.
type LocalZone struct {
	Zone     string
	Bucket   []byte
	Rate     uint32 // tokens per period
	PeriodMs uint32
	Burst    uint32 // capacity; 0 = Rate
	Cost     uint32
}

// LocalLimiter is the fallback for `fail: local`: in-process token buckets,
// one per (zone, rendered bucket), with the zone's rate and burst, on this
// node only. It keeps the same all-or-nothing rule as RateLimitly: a request
// consumes from every bucket only when every bucket has enough tokens.
type LocalLimiter struct {
	mu      sync.Mutex
	now     func() time.Time
	buckets map[string]*localBucket
	max     int
	key     []byte
	scratch []*localBucket
}

type localBucket struct {
	tokens float64
	last   int64 // unix ns of the last refill
}

// DefaultLocalMaxBuckets bounds the fallback's memory.
const DefaultLocalMaxBuckets = 1 << 16

// NewLocalLimiter returns a limiter holding at most max buckets (0 =
// DefaultLocalMaxBuckets); now is the clock (nil = time.Now).
func NewLocalLimiter(now func() time.Time, max int) *LocalLimiter {
	if now == nil {
		now = time.Now
	}
	if max <= 0 {
		max = DefaultLocalMaxBuckets
	}
	return &LocalLimiter{now: now, buckets: make(map[string]*localBucket), max: max}
}

func capacity(z *LocalZone) float64 {
	if z.Burst > 0 {
		return float64(z.Burst)
	}
	return float64(z.Rate)
}

func (l *LocalLimiter) refill(b *localBucket, z *LocalZone, now int64) {
	if z.PeriodMs == 0 || z.Rate == 0 {
		b.last = now
		return
	}
	el := float64(now - b.last)
	if el > 0 {
		b.tokens += el * float64(z.Rate) / (float64(z.PeriodMs) * 1e6)
		b.last = now
	}
	if c := capacity(z); b.tokens > c {
		b.tokens = c
	}
}

// Take decides one request against every zone. out (len(zones)) receives
// each zone's remaining whole tokens and retry-after. Steady state (every
// bucket already exists) allocates nothing.
func (l *LocalLimiter) Take(zones []LocalZone, out []ZoneState) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now().UnixNano()
	l.scratch = l.scratch[:0]
	ok := true
	for i := range zones {
		z := &zones[i]
		l.key = append(append(append(l.key[:0], z.Zone...), 0), z.Bucket...)
		b := l.buckets[string(l.key)]
		if b == nil {
			if len(l.buckets) >= l.max {
				l.evict(now)
			}
			b = &localBucket{tokens: capacity(z), last: now}
			l.buckets[string(l.key)] = b
		}
		l.refill(b, z, now)
		l.scratch = append(l.scratch, b)
		cost := float64(z.Cost)
		if b.tokens < cost {
			ok = false
			short := cost - b.tokens
			retry := uint32(1)
			if z.Rate > 0 {
				ms := math.Ceil(short * float64(z.PeriodMs) / float64(z.Rate))
				if ms > math.MaxUint32 {
					ms = math.MaxUint32
				}
				if ms > 1 {
					retry = uint32(ms)
				}
			} else {
				retry = math.MaxUint32
			}
			out[i] = ZoneState{Remaining: uint32(b.tokens), RetryAfterMs: retry, Known: true}
		} else {
			out[i] = ZoneState{Remaining: uint32(b.tokens - cost), Known: true}
		}
	}
	if ok {
		for i, b := range l.scratch {
			b.tokens -= float64(zones[i].Cost)
		}
	} else {
		// Not consumed: report the remaining of the untouched buckets.
		for i, b := range l.scratch {
			if out[i].RetryAfterMs == 0 {
				out[i].Remaining = uint32(b.tokens)
			}
		}
	}
	return ok
}

// evict drops buckets that have not been touched for a minute (a full bucket
// and a missing one behave the same for every rate of at least 1/min); if
// that frees nothing, it starts over, which only ever admits more.
func (l *LocalLimiter) evict(now int64) {
	for k, b := range l.buckets {
		if now-b.last > int64(time.Minute) {
			delete(l.buckets, k)
		}
	}
	if len(l.buckets) >= l.max {
		clear(l.buckets)
	}
}

// Len is the number of buckets held.
func (l *LocalLimiter) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}
