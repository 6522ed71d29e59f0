package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
)

// loadPolicy writes policy (with its credentials path pointed at a temp
// copy of creds) into a temp dir and loads it with the proxy's own loader,
// exactly as `rl-tproxy check` and a reload would.
func loadPolicy(t *testing.T, policy, credPath, creds string) (*admission.Policy, error) {
	t.Helper()
	dir := t.TempDir()
	cf := filepath.Join(dir, "credentials.yaml")
	if err := os.WriteFile(cf, []byte(creds), 0o600); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(policy, "credentials: "+credPath+"\n") {
		t.Fatalf("policy does not read its credentials from %s", credPath)
	}
	policy = strings.Replace(policy, "credentials: "+credPath+"\n", "credentials: "+cf+"\n", 1)
	pf := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pf, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	return admission.Load(pf)
}

func TestConfigMapPolicyLoads(t *testing.T) {
	policy := string(policyFromConfigMap(t))
	creds := string(credentialsFromSecret(t))
	p, err := loadPolicy(t, policy, credentialMount+"/"+credentialKey, creds)
	if err != nil {
		t.Fatalf("the ConfigMap's policy does not load:\n%v", err)
	}
	if p.RateLimitly.Embedded || p.RateLimitly.SRV == "" {
		t.Errorf("want SRV discovery, got embedded=%v srv=%q", p.RateLimitly.Embedded, p.RateLimitly.SRV)
	}
	if p.RateLimitly.Resolver != "" {
		t.Errorf("resolver %q: the pod's resolv.conf (cluster DNS) is intended", p.RateLimitly.Resolver)
	}
	for _, s := range p.Services {
		if !s.Steered() {
			t.Errorf("service %s is not steered: on a node the proxy fronts ports through sk_lookup", s.Name)
		}
	}
	// The loader must be able to reject this file: an unknown key.
	bad := strings.Replace(policy, "\nzones:\n", "\nzones:\n  typo_zone: {bucket: x, rate: 1/s, burst: 1, colour: red}\n", 1)
	if bad == policy {
		t.Fatal("mutation did not apply")
	}
	if _, err := loadPolicy(t, bad, credentialMount+"/"+credentialKey, creds); err == nil {
		t.Fatal("loader accepted a policy with an unknown key")
	}
}

func TestSystemdExamplePolicyLoads(t *testing.T) {
	policy := readFile(t, "systemd/examples/policy-nginx.yaml")
	creds := readFile(t, "systemd/examples/credentials.example.yaml")
	p, err := loadPolicy(t, policy, "/etc/rl-tproxy/credentials.yaml", creds)
	if err != nil {
		t.Fatalf("examples/policy-nginx.yaml does not load:\n%v", err)
	}
	if len(p.Services) != 1 || p.Services[0].Port != 80 || !p.Services[0].Steered() {
		t.Errorf("want one service steering port 80 (nginx), got %d services", len(p.Services))
	}
}

func TestExampleCredentialsParse(t *testing.T) {
	for name, data := range map[string][]byte{
		"secret.example.yaml":      credentialsFromSecret(t),
		"credentials.example.yaml": []byte(readFile(t, "systemd/examples/credentials.example.yaml")),
	} {
		creds, err := credentials.Parse(name, data)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if len(creds) != 1 || creds[0].Tenant != "example-tenant" {
			t.Errorf("%s: want the one example credential, got %v", name, creds)
		}
	}
}
