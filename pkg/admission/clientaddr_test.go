package admission

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestLoadClientAddress(t *testing.T) {
	p := ptLoad(t, ptEmbedded+"defaults:\n  client_address: {from: x-forwarded-for, trusted: [10.0.0.0/8, 192.0.2.7]}\n"+
		ptService+"  - name: own\n    listen: 127.0.0.1:8082\n    upstream: 127.0.0.1:8081\n"+
		"    client_address: {from: forwarded, trusted: ['2001:db8::/32']}\n")
	web, own := p.Services[0].ClientAddress, p.Services[1].ClientAddress
	if web == nil || web.From != ClientFromXFF || web.Trusted.Len() != 2 {
		t.Fatalf("web inherits %+v, want x-forwarded-for with 2 prefixes", web)
	}
	if own == nil || own.From != ClientFromForwarded || !own.Trusted.Contains(netip.MustParseAddr("2001:db8::9")) {
		t.Fatalf("own service's setting %+v", own)
	}
	if p := ptLoad(t, ptEmbedded+ptService); p.Services[0].ClientAddress != nil {
		t.Fatal("client_address set without being written")
	}
}

func TestLoadClientAddressErrors(t *testing.T) {
	for _, tc := range []struct{ name, setting, want string }{
		{"bad from", "{from: x-real-ip, trusted: [10.0.0.0/8]}", `6: services[0] (web).client_address.from: want x-forwarded-for or forwarded, got "x-real-ip"`},
		{"no from", "{trusted: [10.0.0.0/8]}", "6: services[0] (web).client_address: from is required"},
		{"no trusted", "{from: forwarded}", "6: services[0] (web).client_address: trusted is required"},
		{"empty trusted", "{from: forwarded, trusted: []}", "6: services[0] (web).client_address: trusted is required"},
		{"bad cidr", "{from: forwarded, trusted: [10.0.0.0/8, 10.0.0.1/8]}", `6: services[0] (web).client_address.trusted: trusted "10.0.0.1/8": host bits set (did you mean 10.0.0.0/8?)`},
		{"not an address", "{from: forwarded, trusted: [balancer.internal]}", `6: services[0] (web).client_address.trusted: trusted "balancer.internal": not a CIDR or an address`},
		{"unknown key", "{from: forwarded, trusted: [10.0.0.0/8], hops: 2}", `unknown key "hops"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(ptWrite(t, ptEmbedded+ptService+"    client_address: "+tc.setting+"\n", ""))
			var le *LoadError
			if !errors.As(err, &le) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestClientAddressResolve(t *testing.T) {
	p := ptLoad(t, ptEmbedded+ptService+"    client_address: {from: x-forwarded-for, trusted: [127.0.0.1]}\n")
	ca := p.Services[0].ClientAddress
	lb, other := netip.MustParseAddrPort("127.0.0.1:4000"), netip.MustParseAddrPort("192.0.2.1:4000")
	for _, tc := range []struct {
		peer   netip.AddrPort
		values []string
		want   netip.AddrPort
	}{
		{lb, []string{"198.51.100.9, 203.0.113.7"}, netip.MustParseAddrPort("203.0.113.7:0")},
		{lb, []string{"garbage"}, lb},
		{lb, nil, lb},
		{other, []string{"203.0.113.7"}, other},
	} {
		var vs [][]byte
		for _, v := range tc.values {
			vs = append(vs, []byte(v))
		}
		if got := ca.Resolve(tc.peer, vs); got != tc.want {
			t.Errorf("Resolve(%v, %q) = %v, want %v", tc.peer, tc.values, got, tc.want)
		}
	}
	var none *ClientAddress
	if got := none.Resolve(lb, [][]byte{[]byte("203.0.113.7")}); got != lb {
		t.Errorf("no client_address resolved %v", got)
	}
}

func TestTemplatePeerAddr(t *testing.T) {
	tm, err := CompileTemplate("{remote_addr}|{remote_port}|{peer_addr}")
	if err != nil {
		t.Fatal(err)
	}
	peer := netip.MustParseAddrPort("10.0.0.5:4000")
	for _, tc := range []struct {
		r    Request
		want string
	}{
		{Request{Remote: netip.MustParseAddrPort("203.0.113.7:0"), Peer: peer}, "203.0.113.7|0|10.0.0.5"},
		{Request{Remote: peer}, "10.0.0.5|4000|10.0.0.5"}, // no client_address: the peer is the client
	} {
		got, err := tm.Render(nil, &tc.r)
		if err != nil || string(got) != tc.want {
			t.Errorf("Render = %q, %v; want %q", got, err, tc.want)
		}
	}
}

func TestForwardingHeaderWarning(t *testing.T) {
	p := ptLoad(t, ptEmbedded+"zones:\n  spoofable: {bucket: \"c:{header.X-Forwarded-For}\", rate: 1/s}\n  fine: {bucket: \"c:{remote_addr}\", rate: 1/s}\n"+ptService)
	var got []string
	for _, w := range p.Warnings {
		if strings.Contains(w.Msg, "which any client can write") {
			got = append(got, w.Error())
		}
	}
	if len(got) != 1 || !strings.Contains(got[0], ":3: zones.spoofable.bucket renders {header.x-forwarded-for}") || !strings.Contains(got[0], "client_address") {
		t.Fatalf("warnings %q, want one for zone spoofable at line 3 suggesting client_address", got)
	}
}
