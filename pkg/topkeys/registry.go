package topkeys

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Mode says whether and how keys are shown.
type Mode uint8

const (
	// Plain shows keys as rendered.
	Plain Mode = iota
	// Hashed shows "sha256:" and the first 16 hex digits of SHA-256 over a
	// random per-process salt and the key: stable while the process runs,
	// not reversible by trying likely keys.
	Hashed
)

// ParseMode reads a --top-keys value: "on" (Plain) or "hashed".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "on":
		return Plain, nil
	case "hashed":
		return Hashed, nil
	}
	return 0, fmt.Errorf("%q: want on, hashed or off", s)
}

// MaxN bounds the n of a query (the keys one sub-window can hold).
const MaxN = Slots

// Registry holds the zones of the policy in force by name.
type Registry struct {
	mode Mode
	salt [16]byte
	seed maphash.Seed
	now  func() time.Time

	mu    sync.Mutex
	zones map[string]*Zone
}

// NewRegistry returns an empty registry; now is the clock of queries (nil
// = time.Now), which must agree with the times passed to Allow and Deny.
func NewRegistry(mode Mode, now func() time.Time) *Registry {
	r := &Registry{mode: mode, seed: maphash.MakeSeed(), now: now, zones: map[string]*Zone{}}
	if r.now == nil {
		r.now = time.Now
	}
	_, _ = rand.Read(r.salt[:]) // never fails (crypto/rand)
	return r
}

// Zone returns the zone called name, creating it; nil on a nil Registry.
func (r *Registry) Zone(name string) *Zone {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	z := r.zones[name]
	if z == nil {
		z = newZone(r.seed)
		r.zones[name] = z
	}
	return z
}

// Retain drops every zone not named (a policy change removed it), so
// that memory stays bounded by the zones of the policy in force.
func (r *Registry) Retain(names []string) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for n := range r.zones {
		if !slices.Contains(names, n) {
			delete(r.zones, n)
		}
	}
}

// ZoneTop is one zone of an answer.
type ZoneTop struct {
	Zone string `json:"zone"`
	Summary
}

// Answer is the JSON body of GET /top.
type Answer struct {
	WindowSeconds    int       `json:"window_seconds"`
	SubWindowSeconds int       `json:"sub_window_seconds"`
	Slots            int       `json:"slots"`
	Hashed           bool      `json:"hashed"`
	Zones            []ZoneTop `json:"zones"`
}

// Top answers for the zone called zone ("" = every zone, by name) with
// at most n keys each.
func (r *Registry) Top(zone string, n int) (Answer, bool) {
	a := Answer{WindowSeconds: int(Window / time.Second), SubWindowSeconds: int(SubWindow / time.Second),
		Slots: Slots, Hashed: r.mode == Hashed, Zones: []ZoneTop{}}
	r.mu.Lock()
	names := make([]string, 0, len(r.zones))
	for name := range r.zones {
		if zone == "" || name == zone {
			names = append(names, name)
		}
	}
	zs := make([]*Zone, len(names))
	slices.Sort(names)
	for i, name := range names {
		zs[i] = r.zones[name]
	}
	r.mu.Unlock()
	if zone != "" && len(zs) == 0 {
		return a, false
	}
	now := r.now().UnixNano()
	for i, z := range zs {
		s := z.Top(n, now)
		if r.mode == Hashed {
			for j := range s.Keys {
				s.Keys[j].Key, s.Keys[j].Truncated = r.hash(s.Keys[j].Key), false
			}
		}
		a.Zones = append(a.Zones, ZoneTop{Zone: names[i], Summary: s})
	}
	return a, true
}

func (r *Registry) hash(key string) string {
	h := sha256.New()
	h.Write(r.salt[:])
	h.Write([]byte(key))
	return "sha256:" + hex.EncodeToString(h.Sum(nil)[:8])
}

// ServeHTTP answers GET /top?n=N&zone=Z with an Answer (n: 1..MaxN,
// default 10; zone: one zone, default all). 400 on a bad query, 404 for
// an unknown zone, 405 for other methods.
func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	q := req.URL.Query()
	n := 10
	if s := q.Get("n"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 || v > MaxN {
			http.Error(w, fmt.Sprintf("n=%.40q: want 1..%d", s, MaxN), http.StatusBadRequest)
			return
		}
		n = v
	}
	zone := q.Get("zone")
	if len(zone) > 256 {
		http.Error(w, "zone: too long", http.StatusBadRequest)
		return
	}
	a, ok := r.Top(zone, n)
	if !ok {
		http.Error(w, fmt.Sprintf("zone %.64q: not in the policy in force", zone), http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(a)
}
