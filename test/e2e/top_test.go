package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/topkeys"
)

// GET /top ranks a zone's keys by denies: 30 requests of mallory and 8 of
// carol against burst 3 are 27 and 5 denies, mallory first, within the
// error the answer states; the allows are counted too.
func TestTopLimitedKeys(t *testing.T) {
	const burst = 3
	e := newEnv(t, nil, policyOpts{burst: burst})
	for _, k := range []struct {
		key string
		n   int
	}{{"mallory", 30}, {"carol", 8}} {
		denied := 0
		for range k.n {
			if e.get(t, "/api/items", "X-Key: "+k.key).status == 429 {
				denied++
			}
		}
		if denied != k.n-burst {
			t.Fatalf("%s: %d of %d denied, want %d", k.key, denied, k.n, k.n-burst)
		}
	}
	e.p.waitAccess(38) // Done (which feeds /top) ran for every request

	a := getTop(t, e.p.admin, "?zone=strict&n=5")
	if len(a.Zones) != 1 || a.Zones[0].Zone != "strict" {
		t.Fatalf("zones %+v", a.Zones)
	}
	z := a.Zones[0]
	if z.Denies != 32 || len(z.Keys) != 2 {
		t.Fatalf("zone strict: %+v", z)
	}
	for i, want := range []struct {
		key    string
		denies uint64
	}{{"k:mallory", 27}, {"k:carol", 5}} {
		k := z.Keys[i]
		if k.Key != want.key || k.Denies < want.denies || k.Denies-k.Error > want.denies || k.Error > z.ErrorBound {
			t.Errorf("rank %d: %+v, want %s with %d denies ± the stated error", i+1, k, want.key, want.denies)
		}
		if k.Allows < 3 {
			t.Errorf("%s: allows %d, want at least the 3 of the burst", k.Key, k.Allows)
		}
	}
	// Every zone of the policy, and a hostile query.
	if a := getTop(t, e.p.admin, ""); len(a.Zones) != 2 {
		t.Errorf("all zones: %+v", a.Zones)
	}
	for q, status := range map[string]int{"?n=0": 400, "?n=1000000": 400, "?zone=nope": 404, "?zone=%ff%00": 404} {
		resp, err := http.Get("http://" + e.p.admin + "/top" + q)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != status {
			t.Errorf("/top%s: %d, want %d", q, resp.StatusCode, status)
		}
	}
}

// --top-keys hashed shows no key as rendered.
func TestTopKeysHashed(t *testing.T) {
	e := newEnv(t, nil, policyOpts{args: []string{"--top-keys", "hashed"}})
	for range 5 {
		e.get(t, "/api/items", "X-Key: mallory")
	}
	e.p.waitAccess(5)
	a := getTop(t, e.p.admin, "?zone=strict")
	if !a.Hashed || len(a.Zones) != 1 || len(a.Zones[0].Keys) != 1 {
		t.Fatalf("%+v", a)
	}
	if k := a.Zones[0].Keys[0]; k.Key == "k:mallory" || len(k.Key) != len("sha256:")+16 || k.Denies != 2 {
		t.Fatalf("hashed key %+v", k)
	}
}

func getTop(t *testing.T, admin, query string) topkeys.Answer {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/top" + query)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("/top%s: %d %s", query, resp.StatusCode, b)
	}
	var a topkeys.Answer
	if err := json.Unmarshal(b, &a); err != nil {
		t.Fatalf("/top%s: %v: %s", query, err, b)
	}
	return a
}
