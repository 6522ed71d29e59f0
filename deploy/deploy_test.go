package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

const kubeDir = "kubernetes"

// wantCaps is the exact capability set the DaemonSet adds and the systemd
// unit keeps. capabilities_test.go proves on the running kernel that it is
// sufficient and that each member is necessary.
var wantCaps = []string{"BPF", "NET_ADMIN"}

const (
	adminPort       = 9901
	policyMount     = "/etc/rl-tproxy/policy"
	credentialMount = "/etc/rl-tproxy/credentials"
	policyKey       = "policy.yaml"
	credentialKey   = "credentials.yaml"
)

// manifest is one decoded Kubernetes object and where it came from.
type manifest struct {
	file string
	kind string
	obj  any
}

// splitDocs splits a YAML stream on document separators.
func splitDocs(data []byte) [][]byte {
	var docs [][]byte
	var cur []string
	flush := func() {
		doc := strings.Join(cur, "\n")
		cur = nil
		if strings.TrimSpace(stripComments(doc)) != "" {
			docs = append(docs, []byte(doc))
		}
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.TrimRight(line, " \t") == "---" {
			flush()
			continue
		}
		cur = append(cur, line)
	}
	flush()
	return docs
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// newObject returns an empty typed object for an apiVersion and kind.
func newObject(apiVersion, kind string) (any, error) {
	switch apiVersion + "/" + kind {
	case "apps/v1/DaemonSet":
		return &appsv1.DaemonSet{}, nil
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "v1/Secret":
		return &corev1.Secret{}, nil
	case "v1/Namespace":
		return &corev1.Namespace{}, nil
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}, nil
	}
	return nil, fmt.Errorf("unexpected object %s %s", apiVersion, kind)
}

// decodeStrict decodes one YAML document into its k8s.io/api type; unknown
// or duplicate fields are errors.
func decodeStrict(doc []byte) (kind string, obj any, err error) {
	var tm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return "", nil, fmt.Errorf("read apiVersion/kind: %w", err)
	}
	obj, err = newObject(tm.APIVersion, tm.Kind)
	if err != nil {
		return "", nil, err
	}
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return "", nil, fmt.Errorf("strict decode %s: %w", tm.Kind, err)
	}
	return tm.Kind, obj, nil
}

// loadManifests decodes every manifest under kubernetes/ except the
// kustomization.
func loadManifests(t *testing.T) []manifest {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(kubeDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests under %s: %v", kubeDir, err)
	}
	var out []manifest
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs := splitDocs(data)
		if len(docs) == 0 {
			t.Errorf("%s: no YAML document", f)
		}
		for _, doc := range docs {
			kind, obj, err := decodeStrict(doc)
			if err != nil {
				t.Errorf("%s: %v", f, err)
				continue
			}
			out = append(out, manifest{file: filepath.Base(f), kind: kind, obj: obj})
		}
	}
	return out
}

func only[T any](t *testing.T, ms []manifest) T {
	t.Helper()
	var found []T
	for _, m := range ms {
		if v, ok := m.obj.(T); ok {
			found = append(found, v)
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("want exactly one %T, found %d", zero, len(found))
	}
	return found[0]
}

func TestManifestsDecodeStrictly(t *testing.T) {
	ms := loadManifests(t)
	kinds := map[string]int{}
	for _, m := range ms {
		kinds[m.kind]++
		if ns := objectNamespace(m.obj); m.kind != "Namespace" && ns != "rl-tproxy" {
			t.Errorf("%s: %s in namespace %q, want rl-tproxy", m.file, m.kind, ns)
		}
	}
	for _, k := range []string{"DaemonSet", "ConfigMap", "Secret", "Namespace", "ServiceAccount"} {
		if kinds[k] != 1 {
			t.Errorf("want one %s, have %d", k, kinds[k])
		}
	}
}

func objectNamespace(obj any) string {
	switch o := obj.(type) {
	case *appsv1.DaemonSet:
		return o.Namespace
	case *corev1.ConfigMap:
		return o.Namespace
	case *corev1.Secret:
		return o.Namespace
	case *corev1.ServiceAccount:
		return o.Namespace
	}
	return ""
}

// The strict decoder is what catches typos: prove it rejects an unknown
// field, a misplaced one and a duplicate key.
func TestDecodeStrictRejects(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(kubeDir, "daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(string) string{
		"unknown field": func(s string) string {
			return strings.Replace(s, "      hostNetwork: true\n", "      hostNetwork: true\n      hostNetworking: true\n", 1)
		},
		"field at wrong level": func(s string) string {
			return strings.Replace(s, "  minReadySeconds: 5\n", "  minReadySeconds: 5\n  hostNetwork: true\n", 1)
		},
		"duplicate key": func(s string) string {
			return strings.Replace(s, "      hostNetwork: true\n", "      hostNetwork: true\n      hostNetwork: false\n", 1)
		},
		"wrong type": func(s string) string {
			return strings.Replace(s, "  minReadySeconds: 5\n", "  minReadySeconds: five\n", 1)
		},
	} {
		t.Run(name, func(t *testing.T) {
			bad := mutate(string(data))
			if bad == string(data) {
				t.Fatal("mutation did not apply: daemonset.yaml changed shape")
			}
			if _, _, err := decodeStrict([]byte(bad)); err == nil {
				t.Fatal("strict decode accepted the broken manifest")
			}
		})
	}
}

// The image recipe matches the DaemonSet: its entrypoint is the binary, the
// DaemonSet passes only arguments, and the runtime image runs as root (the
// distroless ":nonroot" variants would not get the added capabilities).
func TestDockerfileMatchesDaemonSet(t *testing.T) {
	df := readFile(t, "container/Dockerfile")
	if !strings.Contains(df, `ENTRYPOINT ["/usr/local/bin/rl-tproxy"]`) {
		t.Error("Dockerfile ENTRYPOINT must be the rl-tproxy binary")
	}
	if !strings.Contains(df, "CGO_ENABLED=0") {
		t.Error("the binary must be static for a distroless/static runtime image")
	}
	for _, line := range strings.Split(df, "\n") {
		if strings.HasPrefix(line, "FROM gcr.io/distroless/") && strings.Contains(line, "nonroot") {
			t.Errorf("%q: the DaemonSet runs as uid 0", line)
		}
		if strings.HasPrefix(line, "USER ") {
			t.Errorf("%q: the DaemonSet runs as uid 0", line)
		}
	}
	ds := only[*appsv1.DaemonSet](t, loadManifests(t))
	if c := ctr(ds); len(c.Command) != 0 {
		t.Errorf("DaemonSet overrides the entrypoint with %v", c.Command)
	}
}
