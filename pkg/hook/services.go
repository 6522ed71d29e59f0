package hook

import (
	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// ProxyServices translates a policy's services into the data path's.
func ProxyServices(p *admission.Policy) []*exchange.Service {
	out := make([]*exchange.Service, 0, len(p.Services))
	for _, s := range p.Services {
		ps := &exchange.Service{
			Name:               s.Name,
			Port:               s.Port,
			Upstream:           s.Upstream,
			XForwardedFor:      s.Forward.XForwardedFor,
			XForwardedProto:    s.Forward.XForwardedProto,
			Forwarded:          s.Forward.Forwarded,
			XRealIP:            s.Forward.XRealIP,
			HeaderTimeout:      s.Timeouts.Header,
			IdleTimeout:        s.Timeouts.Idle,
			UpstreamTimeout:    s.Timeouts.Upstream,
			AdmissionTimeout:   s.Timeouts.Admission,
			MaxRequestsPerConn: s.Limits.MaxRequestsPerConn,
			MaxBodyBytes:       s.Limits.MaxBodyBytes,
			Limits: httpparse.Limits{
				MaxRequestLine: s.Limits.MaxRequestLine,
				MaxHeaderBytes: s.Limits.MaxHeaderBytes,
				MaxHeaders:     s.Limits.MaxHeaders,
			},
			UpstreamProtocol:     s.UpstreamProtocol,
			DecodeEscapedSlashes: s.EscapedSlashes == admission.EscapedSlashesDecode,
			H2: exchange.H2Limits{
				MaxConcurrentStreams: s.H2.MaxConcurrentStreams,
				MaxReadFrameSize:     s.H2.MaxFrameSize,
				HeaderTableSize:      s.H2.HeaderTableSize,
				StreamWindow:         s.H2.StreamWindow,
			},
		}
		ps.ProxyProtocol = s.ProxyProtocol
		if ca := s.ClientAddress; ca != nil && ca.From == admission.ClientFromProxy {
			ps.AcceptProxy = ca.Trusted
		}
		switch s.TLS {
		case admission.TLSPassthrough:
			ps.TLS = exchange.ModePassthrough
		case admission.TLSReject:
			ps.TLS = exchange.ModeReject
		}
		if s.Opaque == admission.OpaqueReject {
			ps.Opaque = exchange.ModeReject
		}
		for _, l := range s.Listen {
			ps.Listen = append(ps.Listen, l.String())
		}
		out = append(out, ps)
	}
	return out
}
