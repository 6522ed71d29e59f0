package wire

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func testKey(t testing.TB, id uint32, fill byte) *Key {
	var s [KeyLen]byte
	for i := range s {
		s[i] = fill + byte(i)
	}
	k, err := NewKey(id, s)
	if err != nil {
		panic(err)
	}
	return k
}

func sampleRequest() *RateRequest {
	return &RateRequest{
		Label:  []byte("api"),
		Guards: []Guard{{Service: []byte("checkout:example.com"), ThresholdMs: 250}},
		Resources: []Resource{
			{Bucket: []byte("client:10.0.0.1"), Rate: 100, PeriodMs: 1000, Burst: 50, Cost: 1},
			{Bucket: []byte("global"), Rate: 1000, PeriodMs: 1000, Burst: 0, Cost: 2},
		},
	}
}

func sampleHeader() Header {
	return Header{Flags: FlagReplay, Attempt: 1, TTLms: 60, RequestID: 0x0102030405060708, Timestamp: 1767225600000}
}

func TestRoundTripAllKinds(t *testing.T) {
	k := testKey(t, 7, 1)
	bodies := []struct {
		in, out Body
	}{
		{sampleRequest(), &RateRequest{}},
		{&RateResponse{Status: StatusOK, Success: true, ServerEpoch: 1767225000000,
			Guards:    []GuardResult{{Passed: true, ObservedMs: 120}},
			Resources: []ResourceResult{{Remaining: 49}, {Remaining: 0, TokensDeficit: 1, RetryAfterMs: 10}}}, &RateResponse{}},
		{&LatencyReport{Entries: []ReportEntry{{Service: []byte("checkout:example.com"), DurationMs: 37}}}, &LatencyReport{}},
		{&Completion{Decision: DecisionAllow, Request: *sampleRequest()}, &Completion{}},
		{&Completion{Decision: DecisionDeny, Request: RateRequest{Guards: []Guard{{Service: []byte("s"), ThresholdMs: 1}}}}, &Completion{}},
	}
	for _, c := range bodies {
		t.Run(c.in.Kind().String(), func(t *testing.T) {
			h := sampleHeader()
			pkt, err := k.Seal(make([]byte, 0, MaxDatagram), &h, c.in)
			if err != nil {
				t.Fatal(err)
			}
			if h.Kind != c.in.Kind() || h.KeyID != 7 {
				t.Fatalf("header not filled: %+v", h)
			}
			var got Header
			if err := k.OpenBody(pkt, &got, c.out); err != nil {
				t.Fatal(err)
			}
			if got != h {
				t.Fatalf("header %+v, want %+v", got, h)
			}
			if !reflect.DeepEqual(c.in, c.out) {
				t.Fatalf("body %+v, want %+v", c.out, c.in)
			}
		})
	}
}

func TestNoncesAreRandom(t *testing.T) {
	k := testKey(t, 1, 0)
	var h1, h2 Header
	if _, err := k.Seal(nil, &h1, sampleRequest()); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Seal(nil, &h2, sampleRequest()); err != nil {
		t.Fatal(err)
	}
	if h1.Nonce == h2.Nonce || h1.Nonce == [NonceLen]byte{} {
		t.Fatal("nonces repeat or are zero")
	}
}

// Every single-bit flip anywhere in a sealed datagram makes Open fail.
func TestTamperAnyByte(t *testing.T) {
	k := testKey(t, 9, 3)
	h := sampleHeader()
	pkt, err := k.Seal(nil, &h, sampleRequest())
	if err != nil {
		t.Fatal(err)
	}
	for i := range pkt {
		for _, bit := range []byte{0x01, 0x80} {
			p := bytes.Clone(pkt)
			p[i] ^= bit
			var got Header
			var req RateRequest
			if err := k.OpenBody(p, &got, &req); err == nil {
				t.Fatalf("byte %d bit %#x: tampered datagram opened", i, bit)
			}
		}
	}
}

func TestWrongKey(t *testing.T) {
	k := testKey(t, 9, 3)
	other := testKey(t, 9, 4)   // same id, other secret
	otherID := testKey(t, 8, 3) // other id, same secret
	h := sampleHeader()
	pkt, _ := k.Seal(nil, &h, sampleRequest())
	var got Header
	if _, err := other.Open(bytes.Clone(pkt), &got); !errors.Is(err, ErrAuth) {
		t.Fatalf("other secret: %v, want ErrAuth", err)
	}
	if _, err := otherID.Open(bytes.Clone(pkt), &got); !errors.Is(err, ErrKeyID) {
		t.Fatalf("other key id: %v, want ErrKeyID", err)
	}
}

func TestHeaderErrors(t *testing.T) {
	k := testKey(t, 1, 0)
	h := sampleHeader()
	pkt, _ := k.Seal(nil, &h, sampleRequest())
	mod := func(f func(p []byte) []byte) []byte { return f(bytes.Clone(pkt)) }
	cases := []struct {
		name string
		pkt  []byte
		want error
	}{
		{"empty", nil, ErrTruncated},
		{"short", pkt[:MinDatagram-1], ErrTruncated},
		{"magic", mod(func(p []byte) []byte { p[0] = 'X'; return p }), ErrMagic},
		{"version", mod(func(p []byte) []byte { p[2] = 2; return p }), ErrVersion},
		{"kind0", mod(func(p []byte) []byte { p[3] = 0; return p }), ErrKind},
		{"kind5", mod(func(p []byte) []byte { p[3] = 5; return p }), ErrKind},
		{"large", make([]byte, MaxDatagram+1), ErrTooLarge},
		{"tag", pkt[:len(pkt)-1], ErrAuth},
	}
	for _, c := range cases {
		var got Header
		if _, err := k.Open(c.pkt, &got); err != c.want {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
}

func TestCheckTime(t *testing.T) {
	now := time.UnixMilli(1767225600000)
	skew := DefaultSkew
	cases := []struct {
		ts   int64
		ttl  uint16
		want error
	}{
		{now.UnixMilli(), 60, nil},
		{now.UnixMilli() + 30000, 60, nil},
		{now.UnixMilli() + 30001, 60, ErrStale},
		{now.UnixMilli() - 30060, 60, nil},
		{now.UnixMilli() - 30061, 60, ErrStale},
		{0, 60, ErrStale},
		{-1, 60, ErrStale}, // 2^64-1
	}
	for _, c := range cases {
		h := Header{Timestamp: uint64(c.ts), TTLms: c.ttl}
		if err := CheckTime(&h, now, skew); err != c.want {
			t.Errorf("ts %d ttl %d: %v, want %v", c.ts, c.ttl, err, c.want)
		}
	}
}

func TestEncodeBounds(t *testing.T) {
	long := func(n int) []byte { return bytes.Repeat([]byte("a"), n) }
	cases := []struct {
		name string
		b    Body
		want error
	}{
		{"label 256", &RateRequest{Label: long(256), Resources: []Resource{{Bucket: long(1), Rate: 1, PeriodMs: 1}}}, nil},
		{"label 257", &RateRequest{Label: long(257)}, ErrStringTooLong},
		{"bucket 1024", &RateRequest{Resources: []Resource{{Bucket: long(1024)}}}, nil},
		{"bucket 1025", &RateRequest{Resources: []Resource{{Bucket: long(1025)}}}, ErrStringTooLong},
		{"bucket empty", &RateRequest{Resources: []Resource{{}}}, ErrStringEmpty},
		{"service empty", &RateRequest{Guards: []Guard{{}}}, ErrStringEmpty},
		{"33 guards", &RateRequest{Guards: make([]Guard, 33)}, ErrCount},
		{"too large", &RateRequest{Resources: []Resource{{Bucket: long(1024)}, {Bucket: long(300)}}}, ErrTooLarge},
		{"report none", &LatencyReport{}, ErrCount},
		{"report empty service", &LatencyReport{Entries: []ReportEntry{{}}}, ErrStringEmpty},
		{"completion decision", &Completion{Decision: 3}, ErrValue},
		{"completion too large", &Completion{Decision: 1, Request: RateRequest{Resources: []Resource{{Bucket: long(1024)}, {Bucket: long(280)}}}}, ErrTooLarge},
		{"response status", &RateResponse{Status: 4}, ErrValue},
		{"response count", &RateResponse{Resources: make([]ResourceResult, 33)}, ErrCount},
	}
	k := testKey(t, 1, 0)
	for _, c := range cases {
		var h Header
		pkt, err := k.Seal(make([]byte, 0, 4096), &h, c.b)
		if err != c.want {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
		if err == nil && len(pkt) > MaxDatagram {
			t.Errorf("%s: %d bytes", c.name, len(pkt))
		}
		if err != nil && len(pkt) != 0 {
			t.Errorf("%s: dst grew on error", c.name)
		}
	}
}

// A body that exactly fills MaxDatagram is accepted, one byte more is not.
// A full label and bucket do not fill it alone, so a guard's service name
// takes the rest.
func TestMaxDatagramBoundary(t *testing.T) {
	k := testKey(t, 1, 0)
	// body = 2 counts + (2 + label) + guard (2 + service + 4) + resource (2 + bucket + 16)
	const label, bucket = MaxLabel, MaxName
	service := MaxBody - (2 + 2 + label + 2 + 4 + 2 + bucket + 16)
	if service <= 0 || service > MaxName {
		t.Fatalf("layout constants changed: service fill %d", service)
	}
	r := &RateRequest{
		Label:     bytes.Repeat([]byte("l"), label),
		Guards:    []Guard{{Service: bytes.Repeat([]byte("s"), service), ThresholdMs: 1}},
		Resources: []Resource{{Bucket: bytes.Repeat([]byte("b"), bucket), Rate: 1, PeriodMs: 1}},
	}
	var h Header
	pkt, err := k.Seal(nil, &h, r)
	if err != nil || len(pkt) != MaxDatagram {
		t.Fatalf("exact fill: len %d err %v", len(pkt), err)
	}
	var got RateRequest
	if err := k.OpenBody(pkt, &h, &got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Guards[0].Service, r.Guards[0].Service) || !bytes.Equal(got.Resources[0].Bucket, r.Resources[0].Bucket) {
		t.Fatal("exact fill did not round-trip")
	}
	r.Guards[0].Service = append(r.Guards[0].Service, 's')
	if _, err := k.Seal(nil, &h, r); err != ErrTooLarge {
		t.Fatalf("one over: %v, want ErrTooLarge", err)
	}
}

func TestDecodeErrors(t *testing.T) {
	req, _ := sampleRequest().AppendBody(nil)
	resp, _ := (&RateResponse{Success: true, Guards: []GuardResult{{Passed: true}}, Resources: []ResourceResult{{}}}).AppendBody(nil)
	rep, _ := (&LatencyReport{Entries: []ReportEntry{{Service: []byte("s"), DurationMs: 1}}}).AppendBody(nil)
	set := func(b []byte, i int, v byte) []byte { b = bytes.Clone(b); b[i] = v; return b }
	cases := []struct {
		name string
		b    Body
		in   []byte
		want error
	}{
		{"req ok", &RateRequest{}, req, nil},
		{"req trailing", &RateRequest{}, append(bytes.Clone(req), 0), ErrTrailing},
		{"req empty", &RateRequest{}, nil, ErrTruncated},
		{"req count", &RateRequest{}, set(req, 0, 33), ErrCount},
		{"req label long", &RateRequest{}, set(set(req, 2, 1), 3, 1), ErrStringTooLong},
		{"resp ok", &RateResponse{}, resp, nil},
		{"resp status", &RateResponse{}, set(resp, 0, 4), ErrValue},
		{"resp success", &RateResponse{}, set(resp, 1, 2), ErrValue},
		{"resp passed", &RateResponse{}, set(resp, 12, 2), ErrValue},
		{"resp count", &RateResponse{}, set(resp, 11, 33), ErrCount},
		{"resp short", &RateResponse{}, resp[:len(resp)-1], ErrTruncated},
		{"resp trailing", &RateResponse{}, append(bytes.Clone(resp), 0), ErrTrailing},
		{"rep ok", &LatencyReport{}, rep, nil},
		{"rep zero", &LatencyReport{}, []byte{0}, ErrCount},
		{"rep empty service", &LatencyReport{}, []byte{1, 0, 0, 0, 0, 0, 1}, ErrStringEmpty},
		{"rep short", &LatencyReport{}, rep[:len(rep)-2], ErrTruncated},
		{"comp decision", &Completion{}, append([]byte{0}, req...), ErrValue},
		{"comp ok", &Completion{}, append([]byte{2}, req...), nil},
		{"comp trailing", &Completion{}, append(append([]byte{1}, req...), 9), ErrTrailing},
	}
	for _, c := range cases {
		if err := c.b.DecodeBody(c.in); err != c.want {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
}

// Decoding reuses slices: a second decode into the same struct does not
// keep entries of the first.
func TestDecodeReuses(t *testing.T) {
	big, _ := sampleRequest().AppendBody(nil)
	small, _ := (&RateRequest{Resources: []Resource{{Bucket: []byte("x"), Rate: 1, PeriodMs: 1}}}).AppendBody(nil)
	var r RateRequest
	if err := r.DecodeBody(big); err != nil {
		t.Fatal(err)
	}
	if err := r.DecodeBody(small); err != nil {
		t.Fatal(err)
	}
	if len(r.Guards) != 0 || len(r.Resources) != 1 || r.Label != nil || string(r.Resources[0].Bucket) != "x" {
		t.Fatalf("stale state: %+v", r)
	}
}

func TestKeyStringRedacts(t *testing.T) {
	var s [KeyLen]byte
	copy(s[:], "SECRETSECRETSECRETSECRETSECRET!!")
	k, _ := NewKey(5, s)
	if strings.Contains(k.String(), "SECRET") || strings.Contains(k.GoString(), "SECRET") {
		t.Fatal("secret leaked")
	}
}

func TestSealBody(t *testing.T) {
	k := testKey(t, 2, 0)
	body, _ := (&RateResponse{Success: true, ServerEpoch: 5}).AppendBody(nil)
	h := Header{Kind: KindRateResponse, Flags: FlagSteering, RequestID: 9}
	pkt, err := k.SealBody(nil, &h, body)
	if err != nil {
		t.Fatal(err)
	}
	var got Header
	var r RateResponse
	if err := k.OpenBody(pkt, &got, &r); err != nil || !r.Success || r.ServerEpoch != 5 {
		t.Fatalf("%v %+v", err, r)
	}
	if _, err := k.SealBody(nil, &Header{}, body); err != ErrKind {
		t.Fatalf("kind 0: %v", err)
	}
}

func BenchmarkSealOpenRequest(b *testing.B) {
	k := testKey(b, 1, 0)
	req := sampleRequest()
	buf := make([]byte, 0, MaxDatagram)
	var h, got Header
	var out RateRequest
	b.ReportAllocs()
	for b.Loop() {
		h = sampleHeader()
		p, err := k.Seal(buf[:0], &h, req)
		if err != nil {
			b.Fatal(err)
		}
		if err := k.OpenBody(p, &got, &out); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeRequest(b *testing.B) {
	body, _ := sampleRequest().AppendBody(nil)
	var r RateRequest
	b.ReportAllocs()
	for b.Loop() {
		if err := r.DecodeBody(body); err != nil {
			b.Fatal(err)
		}
	}
}
