package deploy

import (
	"bytes"
	"encoding/base64"
	"fmt"
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
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
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

// daemonSetProblems lists every invariant of docs/operations.md
// "Kubernetes" that ds breaks.
func daemonSetProblems(ds *appsv1.DaemonSet) []string {
	var p []string
	bad := func(format string, args ...any) { p = append(p, fmt.Sprintf(format, args...)) }
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork {
		bad("hostNetwork must be true: sk_lookup steers the node's network namespace")
	}
	if spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		bad("dnsPolicy %q, want ClusterFirstWithHostNet (cluster DNS for SRV discovery)", spec.DNSPolicy)
	}
	if spec.HostPID || spec.HostIPC {
		bad("hostPID/hostIPC must stay off")
	}
	if spec.TerminationGracePeriodSeconds == nil || *spec.TerminationGracePeriodSeconds < 30 {
		bad("terminationGracePeriodSeconds must be set and >= 30 for the drain")
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		bad("automountServiceAccountToken must be false")
	}
	if ann := ds.Spec.Template.Annotations; ann["prometheus.io/scrape"] != "true" ||
		ann["prometheus.io/port"] != fmt.Sprint(adminPort) || ann["prometheus.io/path"] != "/metrics" {
		bad("prometheus.io scrape/port/path annotations missing or wrong: %v", ann)
	}
	us := ds.Spec.UpdateStrategy
	switch {
	case us.Type != appsv1.RollingUpdateDaemonSetStrategyType || us.RollingUpdate == nil:
		bad("updateStrategy must be RollingUpdate")
	case us.RollingUpdate.MaxUnavailable == nil || us.RollingUpdate.MaxUnavailable.String() != "0":
		bad("rollingUpdate.maxUnavailable must be 0 (old pod kept until the new one took over)")
	case us.RollingUpdate.MaxSurge == nil || us.RollingUpdate.MaxSurge.String() != "1":
		bad("rollingUpdate.maxSurge must be 1 (old and new pod overlap)")
	}
	if len(spec.Containers) != 1 {
		bad("want exactly one container, have %d", len(spec.Containers))
		return p
	}
	if len(spec.InitContainers) != 0 {
		bad("no init containers expected")
	}
	c := spec.Containers[0]
	if len(c.Ports) != 0 {
		bad("declared ports become hostPorts with hostNetwork and block the surge pod: %v", c.Ports)
	}
	p = append(p, securityProblems(c.SecurityContext)...)
	p = append(p, probeProblems("liveness", c.LivenessProbe, "/healthz")...)
	p = append(p, probeProblems("readiness", c.ReadinessProbe, "/readyz")...)
	p = append(p, resourceProblems(c)...)
	p = append(p, argProblems(c.Args)...)
	p = append(p, volumeProblems(spec.Volumes, c.VolumeMounts)...)
	return p
}

func securityProblems(sc *corev1.SecurityContext) []string {
	var p []string
	bad := func(format string, args ...any) { p = append(p, fmt.Sprintf(format, args...)) }
	if sc == nil {
		return []string{"container securityContext missing"}
	}
	if sc.Privileged == nil || *sc.Privileged {
		bad("privileged must be set to false")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		bad("allowPrivilegeEscalation must be false")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		bad("readOnlyRootFilesystem must be true")
	}
	if sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		bad("seccompProfile must be RuntimeDefault")
	}
	if sc.Capabilities == nil {
		bad("capabilities missing")
		return p
	}
	if !slices.Equal(capNames(sc.Capabilities.Drop), []string{"ALL"}) {
		bad("capabilities.drop = %v, want [ALL]", sc.Capabilities.Drop)
	}
	if add := capNames(sc.Capabilities.Add); !slices.Equal(add, wantCaps) {
		bad("capabilities.add = %v, want exactly %v", add, wantCaps)
	}
	return p
}

func capNames(cs []corev1.Capability) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = strings.TrimPrefix(string(c), "CAP_")
	}
	sort.Strings(out)
	return out
}

func probeProblems(name string, pr *corev1.Probe, wantPath string) []string {
	if pr == nil || pr.HTTPGet == nil {
		return []string{name + " probe must be an httpGet probe"}
	}
	var p []string
	g := pr.HTTPGet
	if g.Path != wantPath {
		p = append(p, fmt.Sprintf("%s probe path %q, want %q", name, g.Path, wantPath))
	}
	if g.Port.IntValue() != adminPort {
		p = append(p, fmt.Sprintf("%s probe port %s, want %d", name, g.Port.String(), adminPort))
	}
	if g.Host != "" {
		// The admin listener binds all node addresses; a probe host of
		// 127.0.0.1 would hide a listener that Prometheus cannot reach.
		p = append(p, fmt.Sprintf("%s probe host %q: leave empty (pod IP = node IP)", name, g.Host))
	}
	return p
}

func resourceProblems(c corev1.Container) []string {
	var p []string
	r := c.Resources
	if r.Requests.Cpu().IsZero() || r.Requests.Memory().IsZero() {
		p = append(p, "cpu and memory requests must be set")
	}
	limit := r.Limits.Memory()
	if limit.IsZero() {
		p = append(p, "memory limit must be set")
		return p
	}
	if limit.Cmp(*r.Requests.Memory()) < 0 {
		p = append(p, "memory limit below request")
	}
	// GOMEMLIMIT is a Go size: "230MiB" or plain bytes; the Kubernetes
	// quantity parser reads both once "iB" is trimmed to "i".
	var gml string
	for _, e := range c.Env {
		if e.Name == "GOMEMLIMIT" {
			gml = e.Value
		}
	}
	q, err := resource.ParseQuantity(strings.TrimSuffix(gml, "B"))
	switch {
	case gml == "":
		p = append(p, "GOMEMLIMIT must be set below the memory limit")
	case err != nil:
		p = append(p, fmt.Sprintf("GOMEMLIMIT %q: %v", gml, err))
	case q.Cmp(*limit) >= 0:
		p = append(p, fmt.Sprintf("GOMEMLIMIT %s must be below the memory limit %s", gml, limit))
	}
	return p
}

func argProblems(args []string) []string {
	var p []string
	if len(args) == 0 || args[0] != "run" {
		return []string{fmt.Sprintf("args must start with the run subcommand: %v", args)}
	}
	flags := map[string]string{}
	for _, a := range args[1:] {
		k, v, ok := strings.Cut(a, "=")
		if !ok || !strings.HasPrefix(k, "--") {
			p = append(p, fmt.Sprintf("write flags as --name=value: %q", a))
			continue
		}
		flags[strings.TrimPrefix(k, "--")] = v
	}
	for k := range flags {
		if !slices.Contains([]string{"policy", "admin", "log-format", "log-level"}, k) {
			p = append(p, fmt.Sprintf("run has no flag --%s (DESIGN.md Command line)", k))
		}
	}
	if want := path.Join(policyMount, policyKey); flags["policy"] != want {
		p = append(p, fmt.Sprintf("--policy=%q, want %q", flags["policy"], want))
	}
	if flags["admin"] != fmt.Sprintf(":%d", adminPort) {
		p = append(p, fmt.Sprintf("--admin=%q, want :%d", flags["admin"], adminPort))
	}
	if flags["log-format"] != "json" {
		p = append(p, "--log-format=json expected (access log lines parse as JSON)")
	}
	return p
}

func volumeProblems(vols []corev1.Volume, mounts []corev1.VolumeMount) []string {
	var p []string
	byName := map[string]corev1.Volume{}
	for _, v := range vols {
		byName[v.Name] = v
	}
	seen := map[string]bool{}
	for _, m := range mounts {
		if m.SubPath != "" || m.SubPathExpr != "" {
			p = append(p, fmt.Sprintf("mount %s uses subPath: it would not see ConfigMap/Secret updates", m.Name))
		}
		v, ok := byName[m.Name]
		if !ok {
			p = append(p, fmt.Sprintf("mount %s has no volume", m.Name))
			continue
		}
		switch {
		case v.HostPath != nil:
			if v.HostPath.Path != "/sys/fs/bpf" || m.MountPath != "/sys/fs/bpf" {
				p = append(p, fmt.Sprintf("hostPath %s -> %s: want /sys/fs/bpf -> /sys/fs/bpf", v.HostPath.Path, m.MountPath))
			}
			if v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectory {
				p = append(p, "bpffs hostPath type must be Directory")
			}
			if m.ReadOnly {
				p = append(p, "bpffs must be writable (pins)")
			}
			if m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationHostToContainer {
				p = append(p, "bpffs mountPropagation must be HostToContainer")
			}
			seen["bpffs"] = true
		case v.ConfigMap != nil:
			if m.MountPath != policyMount || !m.ReadOnly || len(v.ConfigMap.Items) != 0 {
				p = append(p, fmt.Sprintf("ConfigMap volume must be mounted whole and read-only at %s", policyMount))
			}
			seen["configmap"] = true
		case v.Secret != nil:
			if m.MountPath != credentialMount || !m.ReadOnly || len(v.Secret.Items) != 0 {
				p = append(p, fmt.Sprintf("Secret volume must be mounted whole and read-only at %s", credentialMount))
			}
			if v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o077 != 0 {
				p = append(p, "Secret defaultMode must not grant group/other access")
			}
			seen["secret"] = true
		default:
			p = append(p, fmt.Sprintf("unexpected volume %s", v.Name))
		}
	}
	for _, k := range []string{"bpffs", "configmap", "secret"} {
		if !seen[k] {
			p = append(p, "missing "+k+" volume mount")
		}
	}
	if len(vols) != len(mounts) {
		p = append(p, "every volume must be mounted exactly once")
	}
	return p
}

func TestDaemonSetInvariants(t *testing.T) {
	ds := only[*appsv1.DaemonSet](t, loadManifests(t))
	for _, problem := range daemonSetProblems(ds) {
		t.Error(problem)
	}
	cm := only[*corev1.ConfigMap](t, loadManifests(t))
	sec := only[*corev1.Secret](t, loadManifests(t))
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name != cm.Name {
			t.Errorf("DaemonSet mounts ConfigMap %q, manifest defines %q", v.ConfigMap.Name, cm.Name)
		}
		if v.Secret != nil && v.Secret.SecretName != sec.Name {
			t.Errorf("DaemonSet mounts Secret %q, manifest defines %q", v.Secret.SecretName, sec.Name)
		}
	}
	if sa := ds.Spec.Template.Spec.ServiceAccountName; sa != only[*corev1.ServiceAccount](t, loadManifests(t)).Name {
		t.Errorf("serviceAccountName %q does not match serviceaccount.yaml", sa)
	}
}

// Each invariant check must be able to fail: break the real DaemonSet one
// way at a time and expect a problem report.
func TestDaemonSetInvariantsCatchBreakage(t *testing.T) {
	cases := map[string]func(*appsv1.DaemonSet){
		"no hostNetwork":  func(d *appsv1.DaemonSet) { d.Spec.Template.Spec.HostNetwork = false },
		"privileged":      func(d *appsv1.DaemonSet) { *ctr(d).SecurityContext.Privileged = true },
		"extra cap":       func(d *appsv1.DaemonSet) { addCap(d, "SYS_ADMIN") },
		"missing cap":     func(d *appsv1.DaemonSet) { ctr(d).SecurityContext.Capabilities.Add = []corev1.Capability{"BPF"} },
		"no drop ALL":     func(d *appsv1.DaemonSet) { ctr(d).SecurityContext.Capabilities.Drop = nil },
		"subPath":         func(d *appsv1.DaemonSet) { ctr(d).VolumeMounts[1].SubPath = "policy.yaml" },
		"no bpffs":        func(d *appsv1.DaemonSet) { dropMount(d, "bpffs") },
		"readonly bpffs":  func(d *appsv1.DaemonSet) { ctr(d).VolumeMounts[0].ReadOnly = true },
		"liveness path":   func(d *appsv1.DaemonSet) { ctr(d).LivenessProbe.HTTPGet.Path = "/" },
		"readiness path":  func(d *appsv1.DaemonSet) { ctr(d).ReadinessProbe.HTTPGet.Path = "/healthz" },
		"no readiness":    func(d *appsv1.DaemonSet) { ctr(d).ReadinessProbe = nil },
		"no mem limit":    func(d *appsv1.DaemonSet) { delete(ctr(d).Resources.Limits, corev1.ResourceMemory) },
		"no requests":     func(d *appsv1.DaemonSet) { ctr(d).Resources.Requests = nil },
		"maxUnavailable1": func(d *appsv1.DaemonSet) { d.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable.IntVal = 1 },
		"OnDelete":        func(d *appsv1.DaemonSet) { d.Spec.UpdateStrategy.Type = appsv1.OnDeleteDaemonSetStrategyType },
		"no scrape":       func(d *appsv1.DaemonSet) { delete(d.Spec.Template.Annotations, "prometheus.io/scrape") },
		"hostPort":        func(d *appsv1.DaemonSet) { ctr(d).Ports = []corev1.ContainerPort{{ContainerPort: adminPort}} },
		"unknown flag":    func(d *appsv1.DaemonSet) { ctr(d).Args = append(ctr(d).Args, "--pin-path=/x") },
		"policy path":     func(d *appsv1.DaemonSet) { ctr(d).Args[1] = "--policy=/etc/policy.yaml" },
		"no grace":        func(d *appsv1.DaemonSet) { d.Spec.Template.Spec.TerminationGracePeriodSeconds = nil },
		"secret mode":     func(d *appsv1.DaemonSet) { *secretVol(d).DefaultMode = 0o444 },
	}
	for name, breakIt := range cases {
		t.Run(name, func(t *testing.T) {
			ds := only[*appsv1.DaemonSet](t, loadManifests(t))
			breakIt(ds)
			if len(daemonSetProblems(ds)) == 0 {
				t.Fatal("invariant check accepted a broken DaemonSet")
			}
		})
	}
}

func ctr(d *appsv1.DaemonSet) *corev1.Container { return &d.Spec.Template.Spec.Containers[0] }

func addCap(d *appsv1.DaemonSet, c corev1.Capability) {
	sc := ctr(d).SecurityContext
	sc.Capabilities.Add = append(sc.Capabilities.Add, c)
}

func dropMount(d *appsv1.DaemonSet, name string) {
	c := ctr(d)
	c.VolumeMounts = slices.DeleteFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == name })
	d.Spec.Template.Spec.Volumes = slices.DeleteFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == name })
}

func secretVol(d *appsv1.DaemonSet) *corev1.SecretVolumeSource {
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Secret != nil {
			return v.Secret
		}
	}
	return &corev1.SecretVolumeSource{DefaultMode: new(int32)}
}

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
