package wire_test

import (
	"fmt"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// A client seals a request into a reusable buffer, and opens the answer
// into a reusable response.
func Example() {
	var secret [wire.KeyLen]byte // from credentials.Credential.Secret
	key, err := wire.NewKey(42, secret)
	if err != nil {
		panic(err)
	}
	buf := make([]byte, 0, wire.MaxDatagram)
	req := wire.RateRequest{Resources: []wire.Resource{{Bucket: []byte("client:192.0.2.10"), Rate: 100, PeriodMs: 1000, Cost: 1}}}
	h := wire.Header{TTLms: 60, RequestID: 0x1234, Timestamp: uint64(time.Now().UnixMilli())}
	pkt, err := key.Seal(buf[:0], &h, &req) // random nonce; Kind and KeyID set
	if err != nil {
		panic(err)
	}
	fmt.Println(h.Kind, len(pkt))

	// ... the server answers; here we play the server.
	var in wire.Header
	var got wire.RateRequest
	if err := key.OpenBody(pkt, &in, &got); err != nil {
		panic(err)
	}
	if err := wire.CheckTime(&in, time.Now(), wire.DefaultSkew); err != nil {
		panic(err)
	}
	fmt.Println(string(got.Resources[0].Bucket))
	// Output:
	// RATE_REQUEST 107
	// client:192.0.2.10
}
