package main

// The defaulter and the validator, as kubebuilder scaffolds them (internal/webhook/v1/
// etcdcluster_webhook.go): a CustomDefaulter and a CustomValidator over the typed EtcdCluster,
// with etcd-webhook's defaults and rules (docs/clusters.md "Rules"). Where they differ from the
// product is in benches/peer-go/README.md.

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/robfig/cron/v3"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

const (
	defaultVersion     = "v3.7.4"
	defaultStorageSize = "10Gi"
	defaultSchedule    = "0 */6 * * *"
	defaultRetention   = int32(7)
	maxSize            = 7
	maxName            = 45
	quotaMin           = int64(16 << 20)
	quotaMax           = int64(8 << 30)
	tlsImmutable       = "is set at creation only: members cannot move between plain HTTP and TLS in place; take a backup, create a cluster with the TLS you want and restore it from that snapshot (README: Member TLS)"
	restoreImmutable   = "is set at creation only: a cluster starts from a snapshot once, before its first member runs"
)

// EtcdClusterCustomDefaulter fills in what the CRD's schema defaults (the product's /mutate).
type EtcdClusterCustomDefaulter struct{}

var _ admission.CustomDefaulter = &EtcdClusterCustomDefaulter{}

func (d *EtcdClusterCustomDefaulter) Default(ctx context.Context, obj runtime.Object) error {
	c, ok := obj.(*EtcdCluster)
	if !ok {
		return fmt.Errorf("expected an EtcdCluster object but got %T", obj)
	}
	// Member TLS (the product's --default-member-tls, on by default): a new cluster that says
	// nothing about it gets spec.tls: {}; an update that leaves it out keeps the stored one.
	if c.Spec.TLS == nil {
		req, err := admission.RequestFromContext(ctx)
		if err != nil {
			return err
		}
		switch req.Operation {
		case admissionv1.Create:
			c.Spec.TLS = &TLS{}
		case admissionv1.Update:
			var old EtcdCluster
			if err := json.Unmarshal(req.OldObject.Raw, &old); err != nil {
				return fmt.Errorf("decoding the stored object: %w", err)
			}
			c.Spec.TLS = old.Spec.TLS
		}
	}
	// Missing fields only (as the schema's defaults): an empty string stays, and is refused.
	if c.Spec.Version == nil {
		v := defaultVersion
		c.Spec.Version = &v
	}
	if c.Spec.StorageSize == nil {
		v := defaultStorageSize
		c.Spec.StorageSize = &v
	}
	if b := c.Spec.Backup; b != nil {
		if b.Enabled == nil {
			f := false
			b.Enabled = &f
		}
		if b.Schedule == nil {
			s := defaultSchedule
			b.Schedule = &s
		}
		if b.Retention == nil {
			r := defaultRetention
			b.Retention = &r
		}
	}
	return nil
}

// EtcdClusterCustomValidator holds the rules.
type EtcdClusterCustomValidator struct{}

var _ admission.CustomValidator = &EtcdClusterCustomValidator{}

func (v *EtcdClusterCustomValidator) ValidateCreate(_ context.Context, obj runtime.Object) (admission.Warnings, error) {
	c, ok := obj.(*EtcdCluster)
	if !ok {
		return nil, fmt.Errorf("expected an EtcdCluster object but got %T", obj)
	}
	var errs field.ErrorList
	errs = append(errs, validateName(c)...)
	warnings, specErrs := validateSpec(&c.Spec)
	return warnings, invalid(c, append(errs, specErrs...))
}

func (v *EtcdClusterCustomValidator) ValidateUpdate(_ context.Context, oldObj, newObj runtime.Object) (admission.Warnings, error) {
	old, ok := oldObj.(*EtcdCluster)
	if !ok {
		return nil, fmt.Errorf("expected an EtcdCluster object but got %T", oldObj)
	}
	c, ok := newObj.(*EtcdCluster)
	if !ok {
		return nil, fmt.Errorf("expected an EtcdCluster object but got %T", newObj)
	}
	warnings, errs := validateSpec(&c.Spec)
	return warnings, invalid(c, append(errs, validateUpdate(&old.Spec, &c.Spec)...))
}

func (v *EtcdClusterCustomValidator) ValidateDelete(context.Context, runtime.Object) (admission.Warnings, error) {
	return nil, nil
}

func invalid(c *EtcdCluster, errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(GroupVersion.WithKind("EtcdCluster").GroupKind(), c.Name, errs)
}

func validateName(c *EtcdCluster) field.ErrorList {
	path, name, limit, prefix := field.NewPath("metadata", "name"), c.Name, maxName, false
	if name == "" && c.GenerateName != "" {
		path, name, limit, prefix = field.NewPath("metadata", "generateName"), c.GenerateName, maxName-5, true
	}
	if name == "" {
		return nil
	}
	var errs field.ErrorList
	if len(name) > limit {
		errs = append(errs, field.Invalid(path, name, fmt.Sprintf("must be no more than %d characters: the cluster's CronJob <name>-backup may have at most 52", limit)))
	}
	check := name
	if prefix {
		check = name + "a" // a prefix may end with '-'
	}
	for _, msg := range validation.IsDNS1035Label(check) {
		if !strings.Contains(msg, "no more than") {
			errs = append(errs, field.Invalid(path, name, msg+": the cluster's Services are named after it"))
		}
	}
	return errs
}

var releasePattern = regexp.MustCompile(`^v([0-9]+)\.([0-9]+)\.([0-9]+)$`)

type release struct{ major, minor, patch uint64 }

// The etcd releases admitted (each minor line from its oldest patch on) and the patch each line
// must reach before the next minor: the product's api::etcd_version::RELEASES.
var (
	oldestPatch = map[uint64]uint64{5: 1, 6: 4, 7: 4}
	beforeNext  = map[uint64]uint64{5: 32, 6: 11}
)

func parseRelease(s string) (release, bool) {
	m := releasePattern.FindStringSubmatch(s)
	if m == nil {
		return release{}, false
	}
	var r release
	var err1, err2, err3 error
	r.major, err1 = strconv.ParseUint(m[1], 10, 64)
	r.minor, err2 = strconv.ParseUint(m[2], 10, 64)
	r.patch, err3 = strconv.ParseUint(m[3], 10, 64)
	return r, err1 == nil && err2 == nil && err3 == nil
}

func (r release) less(o release) bool {
	if r.major != o.major {
		return r.major < o.major
	}
	if r.minor != o.minor {
		return r.minor < o.minor
	}
	return r.patch < o.patch
}

func (r release) String() string { return fmt.Sprintf("v%d.%d.%d", r.major, r.minor, r.patch) }

// gib reads a whole number of GiB ("20Gi").
func gib(s string) (int64, bool) {
	n, found := strings.CutSuffix(s, "Gi")
	if !found || n == "" || strings.TrimLeft(n, "0123456789") != "" {
		return 0, false
	}
	v, err := strconv.ParseInt(n, 10, 64)
	return v, err == nil
}

func quotaOfVolume(storageSize string) int64 {
	v, ok := gib(storageSize)
	if !ok || v >= 17 { // (17 GiB - 384 MiB) / 2 is past the 8 GiB cap (and no overflow)
		return quotaMax
	}
	// Half of what the WAL's 6 x 64 MiB leave, to the MiB, within 16 MiB..8 GiB.
	half := (v*(1<<30) - 6*(64<<20)) / 2 &^ ((1 << 20) - 1)
	return min(max(half, quotaMin), quotaMax)
}

// or reads an optional field, missing as its default (as the schema fills it in).
func or(p *string, d string) string {
	if p == nil {
		return d
	}
	return *p
}

func hasSpace(s string) bool { return strings.IndexFunc(s, unicode.IsSpace) >= 0 }

var cronMacros = []string{"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}

// checkSchedule reads a schedule as Kubernetes' CronJob controller does (robfig/cron's
// ParseStandard), without what the product refuses: @every, time zones, '?' outside the day
// fields.
func checkSchedule(schedule string) error {
	trimmed := strings.TrimSpace(schedule)
	if strings.HasPrefix(trimmed, "@") {
		if !slices.Contains(cronMacros, trimmed) {
			return fmt.Errorf("unknown macro %q (use one of %s)", trimmed, strings.Join(cronMacros, ", "))
		}
		return nil
	}
	if strings.HasPrefix(trimmed, "TZ=") || strings.HasPrefix(trimmed, "CRON_TZ=") {
		return fmt.Errorf("time zones are not supported in the schedule")
	}
	if f := strings.Fields(trimmed); len(f) == 5 && strings.Contains(f[0]+f[1]+f[3], "?") {
		return fmt.Errorf("'?' is only for the day fields")
	}
	_, err := cron.ParseStandard(trimmed)
	return err
}

var storageClassPattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
var retentionPattern = regexp.MustCompile(`^(0|[1-9][0-9]{0,3}(s|m|h))$`)

func validateSpec(s *EtcdClusterSpec) (admission.Warnings, field.ErrorList) {
	spec := field.NewPath("spec")
	var errs field.ErrorList
	var warnings admission.Warnings
	switch {
	case s.Size < 1 || s.Size > maxSize:
		errs = append(errs, field.Invalid(spec.Child("size"), s.Size, fmt.Sprintf("must be between 1 and %d", maxSize)))
	case s.Size%2 == 0:
		errs = append(errs, field.Invalid(spec.Child("size"), s.Size, fmt.Sprintf("must be odd: etcd needs a majority quorum, and %d members survive no more failures than %d", s.Size, s.Size-1)))
	case s.Size == 1:
		warnings = append(warnings, "spec.size is 1: a single member has no fault tolerance; use 3 or 5 for production")
	}
	version, storageSize := or(s.Version, defaultVersion), or(s.StorageSize, defaultStorageSize)
	if r, ok := parseRelease(version); !ok {
		errs = append(errs, field.Invalid(spec.Child("version"), version, "must be an etcd release like v3.5.10"))
	} else if oldest, ok := oldestPatch[r.minor]; r.major != 3 || !ok || r.patch < oldest {
		errs = append(errs, field.Invalid(spec.Child("version"), version, "must be v3.5.1 or a later v3.5 patch, v3.6.4 or a later v3.6 patch, or v3.7.4 or a later v3.7 patch: the etcd releases this operator runs and tests (v3.4 and older lack learners, the v3 member API or the metrics listener it uses)"))
	}
	if c := s.StorageClass; c != nil {
		switch {
		case *c == "":
			errs = append(errs, field.Invalid(spec.Child("storageClass"), *c, "must not be empty: leave the field out for the cluster's default class"))
		case len(*c) > 253:
			errs = append(errs, field.Invalid(spec.Child("storageClass"), *c, "must be at most 253 characters (a StorageClass name)"))
		case !storageClassPattern.MatchString(*c):
			errs = append(errs, field.Invalid(spec.Child("storageClass"), *c, "must be a StorageClass name: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit"))
		}
	}
	if v, ok := gib(storageSize); !ok {
		errs = append(errs, field.Invalid(spec.Child("storageSize"), storageSize, "must be a whole number of GiB, like 10Gi"))
	} else if v == 0 {
		errs = append(errs, field.Invalid(spec.Child("storageSize"), storageSize, "must be at least 1Gi"))
	}
	if b := s.Backup; b != nil {
		path := spec.Child("backup")
		if b.Schedule != nil {
			if err := checkSchedule(*b.Schedule); err != nil {
				errs = append(errs, field.Invalid(path.Child("schedule"), *b.Schedule, "must be a 5-field cron schedule: "+err.Error()))
			}
		}
		if b.Retention != nil && (*b.Retention < 1 || *b.Retention > 100) {
			errs = append(errs, field.Invalid(path.Child("retention"), *b.Retention, "must be between 1 and 100 snapshots"))
		}
		if d := b.Destination; d != nil {
			if rest, found := strings.CutPrefix(*d, "s3://"); !found {
				errs = append(errs, field.Invalid(path.Child("destination"), *d, "is not supported: use s3://bucket/prefix (S3 or an S3-compatible store), or leave it unset to keep snapshots on the volume claim NAME-backup"))
			} else if bucket, _, _ := strings.Cut(rest, "/"); bucket == "" || hasSpace(*d) {
				errs = append(errs, field.Invalid(path.Child("destination"), *d, "must name a bucket, like s3://bucket/prefix, with no spaces"))
			}
		}
	}
	if m := s.Maintenance; m != nil {
		path := spec.Child("maintenance")
		if q := m.QuotaBackendBytes; q != nil {
			if most := quotaOfVolume(storageSize); *q < quotaMin || *q > most {
				errs = append(errs, field.Invalid(path.Child("quotaBackendBytes"), *q, fmt.Sprintf("must be between %d (16 MiB) and %d: half of storageSize %s after the WAL's 384 MiB, at most %d (8 GiB), so the copy a defragmentation writes fits beside the database", quotaMin, most, storageSize, quotaMax)))
			}
		}
		if r := m.AutoCompactionRetention; r != nil && !retentionPattern.MatchString(*r) {
			errs = append(errs, field.Invalid(path.Child("autoCompactionRetention"), *r, "must be 0 (keep every revision) or a duration of up to 4 digits in s, m or h, like 30m or 1h"))
		}
		if p := m.DefragThresholdPercent; p != nil && (*p < 0 || *p > 99) {
			errs = append(errs, field.Invalid(path.Child("defragThresholdPercent"), *p, "must be between 0 (only to recover from NOSPACE) and 99"))
		}
	}
	if t := s.TLS; t != nil && t.Certificates != nil && *t.Certificates != "CertManager" && *t.Certificates != "Secrets" {
		errs = append(errs, field.NotSupported(spec.Child("tls", "certificates"), *t.Certificates, []string{"CertManager", "Secrets"}))
	}
	if r := s.Restore; r != nil {
		if msg := restoreSourceError(r.From); msg != "" {
			errs = append(errs, field.Invalid(spec.Child("restore", "from"), r.From, msg))
		}
	}
	return warnings, errs
}

func restoreSourceError(from string) string {
	if hasSpace(from) {
		return "must not contain spaces"
	}
	if rest, found := strings.CutPrefix(from, "s3://"); found {
		bucket, key, ok := strings.Cut(rest, "/")
		if !ok || bucket == "" || key == "" || strings.HasSuffix(key, "/") {
			return "must name a bucket and a snapshot file, like s3://bucket/prefix/NAME-snapshot-<time>.db"
		}
		return ""
	}
	if rest, found := strings.CutPrefix(from, "pvc://"); found {
		claim, file, ok := strings.Cut(rest, "/")
		if !ok || len(validation.IsDNS1123Subdomain(claim)) > 0 || file == "" || strings.Contains(file, "/") || file == "." || file == ".." {
			return "must name a volume claim of this namespace and a file at its top, like pvc://NAME-backup/NAME-snapshot-<time>.db"
		}
		return ""
	}
	return "is not supported: use s3://bucket/prefix/NAME-snapshot-<time>.db, or pvc://NAME-backup/NAME-snapshot-<time>.db for a snapshot on a volume claim of this namespace"
}

func validateUpdate(old, s *EtcdClusterSpec) field.ErrorList {
	spec := field.NewPath("spec")
	var errs field.ErrorList
	if s.Size < old.Size {
		errs = append(errs, field.Forbidden(spec.Child("size"), fmt.Sprintf("cannot shrink from %d to %d: removing members can lose quorum; size may only stay or grow", old.Size, s.Size)))
	}
	oldSize, newSize := or(old.StorageSize, defaultStorageSize), or(s.StorageSize, defaultStorageSize)
	if o, ok := gib(oldSize); ok {
		if n, ok := gib(newSize); ok && n < o {
			errs = append(errs, field.Forbidden(spec.Child("storageSize"), fmt.Sprintf("cannot shrink from %s to %s: volumes can grow but never shrink", oldSize, newSize)))
		}
	}
	switch o, n := old.StorageClass, s.StorageClass; {
	case o != nil && n != nil && *o != *n:
		errs = append(errs, field.Forbidden(spec.Child("storageClass"), fmt.Sprintf("cannot change from %q to %q: volume claims cannot change class", *o, *n)))
	case o != nil && n == nil:
		errs = append(errs, field.Forbidden(spec.Child("storageClass"), fmt.Sprintf("cannot be removed (it was %q): volume claims cannot change class", *o)))
	case o == nil && n != nil:
		errs = append(errs, field.Forbidden(spec.Child("storageClass"), fmt.Sprintf("cannot be set to %q after creation: the claims were made with the cluster's default class, and volume claims cannot change class", *n)))
	}
	if !equality.Semantic.DeepEqual(old.Restore, s.Restore) {
		errs = append(errs, field.Forbidden(spec.Child("restore"), restoreImmutable))
	}
	if !equality.Semantic.DeepEqual(old.TLS, s.TLS) {
		errs = append(errs, field.Forbidden(spec.Child("tls"), tlsImmutable))
	}
	o, ok1 := parseRelease(or(old.Version, defaultVersion))
	n, ok2 := parseRelease(or(s.Version, defaultVersion))
	if ok1 && ok2 && o != n {
		switch {
		case n.less(o):
			errs = append(errs, field.Forbidden(spec.Child("version"), fmt.Sprintf("cannot downgrade from %s to %s: etcd does not support downgrades", o, n)))
		case n.major == o.major && n.minor > o.minor+1:
			errs = append(errs, field.Forbidden(spec.Child("version"), fmt.Sprintf("cannot upgrade from %s to %s: etcd upgrades one minor release at a time; go to v%d.%d.x first", o, n, o.major, o.minor+1)))
		case o.major == 3 && n.minor == o.minor+1 && o.patch < beforeNext[o.minor]:
			errs = append(errs, field.Forbidden(spec.Child("version"), fmt.Sprintf("cannot upgrade from %s to %s: etcd's v3.%d -> v3.%d upgrade needs every member on v3.%d.%d or later first; upgrade to the newest v3.%d patch, then to %s", o, n, o.minor, n.minor, o.minor, beforeNext[o.minor], o.minor, n)))
		}
	}
	return errs
}
