package fault

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit/rlcluster"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// udpPorts lists the local ports of the UDP sockets process pid holds, read
// from /proc/PID/fd (socket inodes) and /proc/net/udp{,6}.
func udpPorts(t testing.TB, pid int) []uint16 {
	t.Helper()
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		t.Fatalf("read %s: %v", fdDir, err)
	}
	inodes := map[string]bool{}
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join(fdDir, e.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	var ports []uint16
	for _, f := range []string{"/proc/net/udp", "/proc/net/udp6"} {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 10 || fs[0] == "sl" || !inodes[fs[9]] {
				continue
			}
			i := strings.LastIndexByte(fs[1], ':')
			port, err := strconv.ParseUint(fs[1][i+1:], 16, 16)
			if err == nil {
				ports = append(ports, uint16(port))
			}
		}
		fh.Close()
	}
	return ports
}

// forger builds the datagrams of the flood.
type forger struct {
	real, wrong *wire.Key
	buf         []byte
}

var floodKinds = []string{"random", "header_garbage", "wrong_key", "wrong_kind", "stale_replay", "unknown_id"}

func (f *forger) datagram(kind string) []byte {
	now := uint64(time.Now().UnixMilli())
	h := wire.Header{Flags: wire.FlagSteering, TTLms: 300, Timestamp: now}
	var id [8]byte
	_, _ = rand.Read(id[:])
	h.RequestID = binary.BigEndian.Uint64(id[:])
	resp := &wire.RateResponse{Status: wire.StatusOK, Success: true, ServerEpoch: 1,
		Resources: []wire.ResourceResult{{Remaining: 1}}}
	var out []byte
	var err error
	switch kind {
	case "random": // random bytes, random length
		n := 1 + int(id[0])*5
		out = make([]byte, n)
		_, _ = rand.Read(out)
	case "header_garbage": // a well-formed clear header, garbage ciphertext and tag
		out = make([]byte, wire.HeaderLen+40)
		_, _ = rand.Read(out)
		h.Kind = wire.KindRateResponse
		h.KeyID = f.real.ID()
		h.Put(out)
	case "wrong_key": // a valid response sealed with another secret under the real key id
		out, err = f.wrong.Seal(f.buf[:0], &h, resp)
	case "wrong_kind": // sealed with the real key, but a RATE_REQUEST
		out, err = f.real.Seal(f.buf[:0], &h, &wire.RateRequest{Resources: []wire.Resource{{Bucket: []byte("x"), Rate: 1, PeriodMs: 1000, Cost: 1}}})
	case "stale_replay": // sealed with the real key, timestamp ten minutes old
		h.Timestamp = now - 10*60*1000
		out, err = f.real.Seal(f.buf[:0], &h, resp)
	case "unknown_id": // authentic and fresh, for a request the client never sent
		out, err = f.real.Seal(f.buf[:0], &h, resp)
	}
	if err != nil {
		panic(fmt.Sprintf("forge %s: %v", kind, err))
	}
	return out
}

// (d) Garbage and forged datagrams flood every UDP port of the proxy
// process while it serves admissions: every request is still allowed by
// RateLimitly, the client counts the flood as dropped datagrams by reason,
// and no forged answer becomes a decision.
func TestForgedDatagramFlood(t *testing.T) {
	c := startCluster(t)
	up := startUpstream(t)
	dir := t.TempDir()
	creds := writeFile(t, filepath.Join(dir, "credentials.yaml"), rlcluster.CredentialYAML(c.cred))
	pol, listen := writePolicy(t, dir, c, policyOpts{fail: "close", unit: "250ms", creds: creds, upstream: up.addr})
	p := startProxy(t, pol, listen, "info", false)
	if st := load(t, p.base+"/api", 20, 4, nil); st[200] != 20 {
		t.Fatalf("warm-up statuses %v", st)
	}
	// Access lines trail responses: let the warm-up's all be counted.
	testkit.WaitWithin(t, 30*time.Second, "the warm-up's access lines", func() bool { o, _ := p.counts(); return total2(o) >= 20 })
	ports := udpPorts(t, p.pid())
	if len(ports) == 0 {
		t.Fatal("no UDP sockets found for the proxy process")
	}
	before := p.scrape()
	allowBefore := seriesValue(before, `rl_tproxy_ratelimitly_checks_total{cause="allow"}`)
	p.resetCounts()

	real, err := wire.NewKey(c.cred.KeyID, c.cred.Secret)
	if err != nil {
		t.Fatal(err)
	}
	wrongCred := newCredential(t, c.cred.KeyID)
	wrong, err := wire.NewKey(wrongCred.KeyID, wrongCred.Secret)
	if err != nil {
		t.Fatal(err)
	}
	f := &forger{real: real, wrong: wrong, buf: make([]byte, 0, wire.MaxDatagram)}
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 9)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	const n, maxFlood = 1000, 400000
	var done atomic.Bool
	sent := map[string]int{}
	flooded := make(chan struct{})
	go func() {
		defer close(flooded)
		for i := 0; i < maxFlood && !done.Load(); i++ {
			kind := floodKinds[i%len(floodKinds)]
			dst := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: int(ports[(i/len(floodKinds))%len(ports)])}
			if _, err := conn.WriteToUDP(f.datagram(kind), dst); err == nil {
				sent[kind]++
			}
		}
	}()
	statuses := load(t, p.base+"/api", n, 8, nil)
	done.Store(true)
	<-flooded
	if statuses[200] != n {
		t.Fatalf("statuses under the flood %v, want %d × 200", statuses, n)
	}
	testkit.WaitWithin(t, 30*time.Second, "access lines", func() bool { o, _ := p.counts(); return total2(o) >= n })
	if o, causes := p.counts(); o["allow"] != n || causes["allow"] != n {
		t.Fatalf("outcomes %v causes %v under the flood, want %d allows", o, causes, n)
	}
	// The flood's last datagrams may still be in the sockets' queues:
	// poll until every reason has risen.
	reasons := map[string]string{"random": "malformed", "header_garbage": "auth", "wrong_key": "auth",
		"wrong_kind": "kind", "stale_replay": "stale", "unknown_id": "unknown_id"}
	var after string
	testkit.WaitWithin(t, 30*time.Second, "dropped-datagram counters to rise for every forged kind", func() bool {
		after = p.scrape()
		for _, r := range reasons {
			s := `rl_tproxy_ratelimitly_datagrams_dropped_total{reason="` + r + `"}`
			if seriesValue(after, s) <= seriesValue(before, s) {
				return false
			}
		}
		return true
	})
	if got := seriesValue(after, `rl_tproxy_ratelimitly_checks_total{cause="allow"}`) - allowBefore; got != n {
		t.Fatalf("client decided %v allows during the flood, want exactly %d (one per request)", got, n)
	}
	for _, cause := range []string{"timeout", "protocol", "cardinality", "deny"} {
		if v := seriesValue(after, `rl_tproxy_ratelimitly_checks_total{cause="`+cause+`"}`); v != 0 {
			t.Fatalf("client cause %s = %v during the flood", cause, v)
		}
	}
	var drops []string
	for _, r := range []string{"malformed", "kind", "auth", "stale", "unknown_id", "unknown_source", "echo", "body", "duplicate"} {
		s := `rl_tproxy_ratelimitly_datagrams_dropped_total{reason="` + r + `"}`
		drops = append(drops, fmt.Sprintf("%s +%v", r, seriesValue(after, s)-seriesValue(before, s)))
	}
	t.Logf("flooded UDP ports %v with %v during %d admissions; drops: %s", ports, sent, n, strings.Join(drops, ", "))
}
