package topkeys

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"
)

var t0 = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) int64 { return t0.Add(d).UnixNano() }

// The window slides: denies older than the window leave the answer;
// allows of a denied key are reported with it.
func TestZoneWindow(t *testing.T) {
	r := NewRegistry(Plain, nil)
	z := r.Zone("strict")
	for i := range 3 {
		z.Allow([]byte("mallory"), at(time.Duration(i)*time.Millisecond))
	}
	for i := range 27 {
		z.Deny([]byte("mallory"), at(time.Second+time.Duration(i)*time.Millisecond))
	}
	for i := range 5 {
		z.Deny([]byte("carol"), at(2*time.Second+time.Duration(i)*time.Millisecond))
	}
	z.Deny([]byte("dave"), at(25*time.Second))

	for _, tc := range []struct {
		at    time.Duration
		n     int
		want  string
		total uint64
	}{
		{3 * time.Second, 10, "mallory:27/0/3 carol:5/0/0", 32},
		{3 * time.Second, 1, "mallory:27/0/3", 32},
		{30 * time.Second, 10, "mallory:27/0/3 carol:5/0/0 dave:1/0/0", 33},
		{59 * time.Second, 10, "mallory:27/0/3 carol:5/0/0 dave:1/0/0", 33},
		{60 * time.Second, 10, "dave:1/0/0", 1}, // the first sub-window left
		{90 * time.Second, 10, "", 0},
	} {
		s := z.Top(tc.n, at(tc.at))
		var parts []string
		for _, k := range s.Keys {
			parts = append(parts, fmt.Sprintf("%s:%d/%d/%d", k.Key, k.Denies, k.Error, k.Allows))
		}
		if got := strings.Join(parts, " "); got != tc.want || s.Denies != tc.total {
			t.Errorf("at %v n=%d: %q (%d denies), want %q (%d)", tc.at, tc.n, got, s.Denies, tc.want, tc.total)
		}
	}
	// A deny for a sub-window that already left is not counted.
	z.Deny([]byte("late"), at(0))
	if s := z.Top(10, at(90*time.Second)); len(s.Keys) != 0 {
		t.Errorf("late deny counted: %v", s.Keys)
	}
}

// More distinct keys than counters: the heavy key stays first and the
// stated error bounds hold against the exact counts.
func TestZoneErrorBound(t *testing.T) {
	z := NewRegistry(Plain, nil).Zone("z")
	exact := map[string]uint64{}
	for i := range 5000 {
		k := fmt.Sprintf("k%d", i%700)
		if i%4 == 0 {
			k = "heavy"
		}
		exact[k]++
		// spread over the six sub-windows of one window
		z.Deny([]byte(k), at(time.Duration(i)*(55*time.Second/5000)))
	}
	s := z.Top(MaxN, at(55*time.Second))
	if s.Denies != 5000 || s.ErrorBound != 5000/Slots {
		t.Fatalf("denies %d bound %d", s.Denies, s.ErrorBound)
	}
	if s.Keys[0].Key != "heavy" {
		t.Fatalf("first %v", s.Keys[0])
	}
	for _, k := range s.Keys {
		tr := exact[k.Key]
		if k.Denies < tr || k.Denies-k.Error > tr || k.Error > s.ErrorBound {
			t.Errorf("%s: %d±%d, true %d, bound %d", k.Key, k.Denies, k.Error, tr, s.ErrorBound)
		}
	}
}

// Allow and Deny from many goroutines while Top reads (run with -race).
func TestZoneConcurrent(t *testing.T) {
	r := NewRegistry(Plain, nil)
	z := r.Zone("z")
	// The first use of a zone clears its first two sub-windows' sketches;
	// allows that race with that clear are not counted.
	z.Allow([]byte("warm"), at(0))
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := []byte(fmt.Sprintf("g%d", g))
			for i := range 2000 {
				d := time.Duration(i) * 10 * time.Millisecond // crosses sub-windows
				if i%3 == 0 {
					z.Deny(key, at(d))
				} else {
					z.Allow(key, at(d))
				}
			}
		}()
	}
	for range 20 {
		z.Top(5, at(10*time.Second))
	}
	wg.Wait()
	s := z.Top(10, at(19*time.Second))
	if len(s.Keys) != 4 {
		t.Fatalf("keys %v", s.Keys)
	}
	for _, k := range s.Keys {
		// 667 denies over 20 s, all in the window; allows: at least the
		// true 1333 (count-min never undercounts).
		if k.Denies != 667 || k.Error != 0 || k.Allows < 1333 {
			t.Errorf("%v", k)
		}
	}
}

func TestServeTop(t *testing.T) {
	now := t0.Add(5 * time.Second)
	for _, mode := range []Mode{Plain, Hashed} {
		r := NewRegistry(mode, func() time.Time { return now })
		z := r.Zone("strict")
		r.Zone("other")
		for range 4 {
			z.Deny([]byte("k:mallory"), at(time.Second))
		}
		z.Deny([]byte("k:carol"), at(time.Second))
		for _, tc := range []struct {
			method, query string
			status        int
			keys          int
		}{
			{"GET", "", 200, 2},
			{"GET", "?n=1&zone=strict", 200, 1},
			{"HEAD", "?zone=other", 200, 0},
			{"GET", "?n=0", 400, 0},
			{"GET", "?n=65", 400, 0},
			{"GET", "?n=99999999999999999999", 400, 0},
			{"GET", "?n=x", 400, 0},
			{"GET", "?zone=nope", 404, 0},
			{"GET", "?zone=" + strings.Repeat("z", 300), 400, 0},
			{"GET", "?zone=%00%ff", 404, 0},
			{"POST", "", 405, 0},
		} {
			rec := httptest.NewRecorder()
			r.ServeHTTP(rec, httptest.NewRequest(tc.method, "/top"+tc.query, nil))
			if rec.Code != tc.status {
				t.Errorf("%v %s %s: %d, want %d: %s", mode, tc.method, tc.query, rec.Code, tc.status, rec.Body)
				continue
			}
			if tc.status != 200 || tc.method == "HEAD" {
				continue
			}
			var a Answer
			if err := json.Unmarshal(rec.Body.Bytes(), &a); err != nil {
				t.Fatal(err)
			}
			var n int
			for _, zt := range a.Zones {
				n += len(zt.Keys)
			}
			if n != tc.keys || a.Hashed != (mode == Hashed) || a.WindowSeconds != 60 {
				t.Errorf("%v %s: %+v", mode, tc.query, a)
			}
			for _, zt := range a.Zones {
				for _, k := range zt.Keys {
					if mode == Hashed && (strings.Contains(k.Key, "mallory") || !strings.HasPrefix(k.Key, "sha256:") || len(k.Key) != 7+16) {
						t.Errorf("hashed key %q", k.Key)
					}
					if mode == Plain && zt.Zone == "strict" && k.Denies == 4 && k.Key != "k:mallory" {
						t.Errorf("plain key %q", k.Key)
					}
				}
			}
		}
	}
}

func TestRetainAndMode(t *testing.T) {
	r := NewRegistry(Plain, nil)
	a, b := r.Zone("a"), r.Zone("b")
	if r.Zone("a") != a || a == b {
		t.Fatal("zones not kept by name")
	}
	r.Retain([]string{"b"})
	if _, ok := r.Top("a", 1); ok {
		t.Fatal("a kept after Retain")
	}
	if r.Zone("b") != b {
		t.Fatal("b replaced")
	}
	var nilReg *Registry
	nilReg.Zone("x").Allow([]byte("k"), 1) // off: every call is a no-op
	nilReg.Zone("x").Deny([]byte("k"), 1)
	nilReg.Retain(nil)
	for in, want := range map[string]error{"on": nil, "hashed": nil} {
		if _, err := ParseMode(in); err != want {
			t.Errorf("%s: %v", in, err)
		}
	}
	if _, err := ParseMode("yes"); err == nil {
		t.Error("yes accepted")
	}
}

func TestServeTopRecorderJSON(t *testing.T) {
	r := NewRegistry(Plain, nil)
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, httptest.NewRequest("GET", "/top", nil))
	if rec.Code != 200 || rec.Header().Get("Content-Type") != "application/json" || strings.TrimSpace(rec.Body.String()) != `{"window_seconds":60,"sub_window_seconds":10,"slots":64,"hashed":false,"zones":[]}` {
		t.Fatalf("%d %q", rec.Code, rec.Body)
	}
}

// StateBytes, which the documentation quotes, is what a zone holds.
func TestStateBytes(t *testing.T) {
	z := newZone(NewRegistry(Plain, nil).seed)
	got := int(unsafe.Sizeof(z.cms))
	for i := range z.ss {
		got += cap(z.ss[i].s.slots) * int(unsafe.Sizeof(ssSlot{}))
	}
	if got != StateBytes {
		t.Fatalf("a zone holds %d bytes, StateBytes says %d", got, StateBytes)
	}
}
