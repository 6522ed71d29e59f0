package exchange

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/proxyproto"
)

// WriteProxyHeader writes the service's PROXY protocol header (if it has
// one) for a connection from client to orig (the address the client
// connected to) on up, a fresh upstream connection, within timeout. The
// HTTP/2 and passthrough paths call it after dialing the upstream.
func WriteProxyHeader(up interface {
	Write([]byte) (int, error)
	SetWriteDeadline(time.Time) error
}, svc *Service, client, orig netip.AddrPort, timeout time.Duration) error {
	if svc.ProxyProtocol == proxyproto.None {
		return nil
	}
	var buf [proxyproto.MaxLen]byte
	hdr := proxyproto.Append(buf[:0], svc.ProxyProtocol, client, orig)
	up.SetWriteDeadline(time.Now().Add(timeout))
	_, err := up.Write(hdr)
	up.SetWriteDeadline(time.Time{})
	if err != nil {
		return fmt.Errorf("write PROXY header to %s: %w", svc.Upstream, err)
	}
	return nil
}
