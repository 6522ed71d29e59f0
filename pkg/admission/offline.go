package admission

import "fmt"

// offlineCredentials stands in for the credentials file under
// LoadOffline: a well-formed key that is never used to talk to anyone.
const offlineCredentials = "tenant: offline\nkey_id: 1\nsecret: b2ZmbGluZS1wbGFjZWhvbGRlci1ub3QtYS1yZWFsLWs=\n"

// LoadOffline is Load for tools that never talk to RateLimitly (rl-tproxy
// simulate): the credentials file is not read, so a policy can be tried
// away from its secrets; a placeholder without max_horizon takes its
// place. Everything else is validated as Load does.
func LoadOffline(path string) (*Policy, error) {
	data, err := readLimited(path)
	if err != nil {
		return nil, fmt.Errorf("load policy %s: %w", path, err)
	}
	return parse(path, data, func(string) ([]byte, error) { return []byte(offlineCredentials), nil })
}

// Variables lists the request variables t uses, as written in templates
// ("remote_addr", "header.x-key"), in order of use, repeated when used
// again.
func (t *Template) Variables() []string {
	if t == nil {
		return nil
	}
	var out []string
	for _, p := range t.parts {
		switch p.kind {
		case varLiteral:
		case varQuery:
			out = append(out, "query."+p.text)
		case varHeader:
			out = append(out, "header."+p.text)
		case varCookie:
			out = append(out, "cookie."+p.text)
		default:
			for name, k := range simpleVars {
				if k == p.kind {
					out = append(out, name)
				}
			}
		}
	}
	return out
}
