// The DaemonSet's invariants (capabilities, security context, probes,
// resources, arguments, volumes) and tests that they catch breakage.

package deploy

import (
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

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
