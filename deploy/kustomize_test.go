// The kustomization, its overlays and the ConfigMap and Secret it ships.

package deploy

import (
	"bytes"
	"encoding/base64"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	yamlv3 "gopkg.in/yaml.v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

// kustomization is the subset of kustomize's Kustomization type these
// manifests use; strict decoding rejects anything else.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace"`
	Resources  []string `json:"resources"`
	Labels     []struct {
		Pairs            map[string]string `json:"pairs"`
		IncludeSelectors bool              `json:"includeSelectors,omitempty"`
	} `json:"labels"`
	Images []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
	} `json:"images"`
}

func TestKustomizationListsEveryFile(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(kubeDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := yaml.UnmarshalStrict(data, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" || k.Namespace != "rl-tproxy" {
		t.Errorf("kustomization header: %+v", k)
	}
	for _, l := range k.Labels {
		if l.IncludeSelectors {
			t.Error("labels must not be added to selectors: a DaemonSet selector is immutable")
		}
	}
	files, _ := filepath.Glob(filepath.Join(kubeDir, "*.yaml"))
	var want []string
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" {
			want = append(want, b)
		}
	}
	got := slices.Clone(k.Resources)
	sort.Strings(got)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Errorf("kustomization resources %v, files %v", got, want)
	}
	ds := only[*appsv1.DaemonSet](t, loadManifests(t))
	image := ctr(ds).Image
	for _, img := range k.Images {
		if !strings.HasPrefix(image, img.Name+":") {
			t.Errorf("images entry %q does not match the DaemonSet image %q", img.Name, image)
		}
	}
}

// kubectl's embedded kustomize must build the directory, and every object
// it emits must still decode strictly.
func TestKustomizeBuild(t *testing.T) {
	kubectl := testkit.NeedTool(t, "kubectl", "kubernetes-client")
	cmd := exec.Command(kubectl, "kustomize", kubeDir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", kubeDir, err, stderr.String())
	}
	docs := splitDocs(out)
	if len(docs) != 5 {
		t.Errorf("kustomize emitted %d objects, want 5", len(docs))
	}
	for _, doc := range docs {
		kind, obj, err := decodeStrict(doc)
		if err != nil {
			t.Errorf("kustomize output: %v", err)
			continue
		}
		if ds, ok := obj.(*appsv1.DaemonSet); ok {
			for _, problem := range daemonSetProblems(ds) {
				t.Errorf("built DaemonSet: %s", problem)
			}
			if ds.Spec.Selector.MatchLabels["app.kubernetes.io/part-of"] != "" {
				t.Error("kustomize changed the DaemonSet selector")
			}
		}
		if kind != "Namespace" && objectNamespace(obj) != "rl-tproxy" {
			t.Errorf("built %s outside namespace rl-tproxy", kind)
		}
	}
}

// policyFromConfigMap returns the policy the ConfigMap carries.
func policyFromConfigMap(t *testing.T) []byte {
	t.Helper()
	cm := only[*corev1.ConfigMap](t, loadManifests(t))
	if len(cm.Data) != 1 || cm.Data[policyKey] == "" {
		t.Fatalf("ConfigMap must carry exactly %s, has %d keys", policyKey, len(cm.Data))
	}
	return []byte(cm.Data[policyKey])
}

// credentialsFromSecret returns the example credentials file.
func credentialsFromSecret(t *testing.T) []byte {
	t.Helper()
	sec := only[*corev1.Secret](t, loadManifests(t))
	if sec.Annotations["rl-tproxy.io/example"] == "" {
		t.Error("the example Secret must be marked as an example")
	}
	if len(sec.StringData)+len(sec.Data) != 1 || sec.StringData[credentialKey] == "" {
		t.Fatalf("Secret must carry exactly %s in stringData", credentialKey)
	}
	return []byte(sec.StringData[credentialKey])
}

func TestConfigMapPolicyShape(t *testing.T) {
	var doc map[string]any
	if err := yamlv3.Unmarshal(policyFromConfigMap(t), &doc); err != nil {
		t.Fatalf("policy is not YAML: %v", err)
	}
	var keys []string
	for k := range doc {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if want := []string{"ratelimitly", "services", "trackers", "zones"}; !slices.Equal(keys, want) {
		t.Errorf("policy top-level keys %v, want %v", keys, want)
	}
	rl, _ := doc["ratelimitly"].(map[string]any)
	if srv, _ := rl["srv"].(string); !strings.HasPrefix(srv, "_ratelimitly._udp.") {
		t.Errorf("ratelimitly.srv = %q: want SRV discovery of a RateLimitly service", srv)
	}
	if rl["embedded"] != nil {
		t.Error("the DaemonSet policy must use the production RateLimitly, not embedded")
	}
	if c, _ := rl["credentials"].(string); c != path.Join(credentialMount, credentialKey) {
		t.Errorf("ratelimitly.credentials = %q, want the Secret mount %s", c, path.Join(credentialMount, credentialKey))
	}
	svcs, _ := doc["services"].([]any)
	if len(svcs) == 0 {
		t.Fatal("policy has no services")
	}
}

func TestSecretExampleCredentials(t *testing.T) {
	var c struct {
		Tenant string `json:"tenant"`
		KeyID  uint32 `json:"key_id"`
		Secret string `json:"secret"`
	}
	if err := yaml.UnmarshalStrict(credentialsFromSecret(t), &c); err != nil {
		t.Fatalf("example credentials: %v", err)
	}
	raw, err := base64.StdEncoding.DecodeString(c.Secret)
	if err != nil || len(raw) != 32 {
		t.Errorf("secret must be base64 of 32 bytes (got %d bytes, %v)", len(raw), err)
	}
	if c.Tenant == "" {
		t.Error("tenant empty")
	}
}

// The no-surge overlay builds and changes only the update strategy.
func TestNoSurgeOverlay(t *testing.T) {
	kubectl := testkit.NeedTool(t, "kubectl", "kubernetes-client")
	out, err := exec.Command(kubectl, "kustomize", "overlays/no-surge").Output()
	if err != nil {
		t.Fatalf("kubectl kustomize overlays/no-surge: %v", err)
	}
	var ds *appsv1.DaemonSet
	for _, doc := range splitDocs(out) {
		_, obj, err := decodeStrict(doc)
		if err != nil {
			t.Fatal(err)
		}
		if d, ok := obj.(*appsv1.DaemonSet); ok {
			ds = d
		}
	}
	if ds == nil {
		t.Fatal("overlay emitted no DaemonSet")
	}
	ru := ds.Spec.UpdateStrategy.RollingUpdate
	if ru == nil || ru.MaxUnavailable.String() != "1" || ru.MaxSurge.String() != "0" {
		t.Fatalf("overlay rollingUpdate = %+v, want maxUnavailable 1, maxSurge 0", ru)
	}
	var rest []string
	for _, p := range daemonSetProblems(ds) {
		if !strings.Contains(p, "maxUnavailable") && !strings.Contains(p, "maxSurge") {
			rest = append(rest, p)
		}
	}
	if len(rest) != 0 {
		t.Errorf("overlay broke other invariants: %v", rest)
	}
}
