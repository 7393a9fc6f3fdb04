package main

// The EtcdCluster v1 types, as a kubebuilder project declares them in api/v1 (the hub and storage
// version of etcd-webhook's CRD, field for field), with the deep copies controller-gen would
// generate. Only v1: the peer registers its webhooks for v1, and the apiserver converts other
// versions to it (matchPolicy: Equivalent), as it does for the product.

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var GroupVersion = schema.GroupVersion{Group: "etcd.example.com", Version: "v1"}

type EtcdClusterSpec struct {
	Size         int32        `json:"size"`
	Version      *string      `json:"version,omitempty"`
	StorageClass *string      `json:"storageClass,omitempty"`
	StorageSize  *string      `json:"storageSize,omitempty"`
	Backup       *Backup      `json:"backup,omitempty"`
	Restore      *Restore     `json:"restore,omitempty"`
	Maintenance  *Maintenance `json:"maintenance,omitempty"`
	TLS          *TLS         `json:"tls,omitempty"`
	Recovery     *Recovery    `json:"recovery,omitempty"`
}

type Recovery struct {
	QuorumLoss *string `json:"quorumLoss,omitempty"`
}

type Backup struct {
	Enabled     *bool   `json:"enabled,omitempty"`
	Schedule    *string `json:"schedule,omitempty"`
	Retention   *int32  `json:"retention,omitempty"`
	Destination *string `json:"destination,omitempty"`
}

type Restore struct {
	From   string  `json:"from"`
	SHA256 *string `json:"sha256,omitempty"`
}

type Maintenance struct {
	QuotaBackendBytes       *int64  `json:"quotaBackendBytes,omitempty"`
	AutoCompactionRetention *string `json:"autoCompactionRetention,omitempty"`
	DefragThresholdPercent  *int32  `json:"defragThresholdPercent,omitempty"`
}

type TLS struct {
	Enabled      *bool      `json:"enabled,omitempty"`
	Certificates *string    `json:"certificates,omitempty"`
	IssuerRef    *IssuerRef `json:"issuerRef,omitempty"`
}

type IssuerRef struct {
	Name  string  `json:"name"`
	Kind  *string `json:"kind,omitempty"`
	Group *string `json:"group,omitempty"`
}

type EtcdClusterStatus struct {
	Phase              string             `json:"phase,omitempty"`
	ReadyReplicas      *int32             `json:"readyReplicas,omitempty"`
	Endpoints          []string           `json:"endpoints,omitempty"`
	ObservedGeneration *int64             `json:"observedGeneration,omitempty"`
	Conditions         []metav1.Condition `json:"conditions,omitempty"`
	Backup             *BackupStatus      `json:"backup,omitempty"`
	Leader             string             `json:"leader,omitempty"`
	Members            []MemberState      `json:"members,omitempty"`
}

type MemberState struct {
	Name                string   `json:"name"`
	ID                  string   `json:"id"`
	Role                string   `json:"role"`
	Healthy             bool     `json:"healthy"`
	Version             string   `json:"version,omitempty"`
	DBSize              *int64   `json:"dbSize,omitempty"`
	DBSizeInUse         *int64   `json:"dbSizeInUse,omitempty"`
	Alarms              []string `json:"alarms,omitempty"`
	LastDefragmentation *string  `json:"lastDefragmentation,omitempty"`
}

type BackupStatus struct {
	Last        *SnapshotRecord `json:"last,omitempty"`
	LastFailure *BackupFailure  `json:"lastFailure,omitempty"`
}

type SnapshotRecord struct {
	Time     string `json:"time"`
	URI      string `json:"uri"`
	Size     int64  `json:"size"`
	SHA256   string `json:"sha256"`
	Revision int64  `json:"revision"`
	Keys     *int64 `json:"keys,omitempty"`
	Member   string `json:"member"`
}

type BackupFailure struct {
	Time    string `json:"time"`
	Step    string `json:"step"`
	Message string `json:"message"`
}

type EtcdCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              EtcdClusterSpec   `json:"spec,omitempty"`
	Status            EtcdClusterStatus `json:"status,omitempty"`
}

type EtcdClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []EtcdCluster `json:"items"`
}

func addToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &EtcdCluster{}, &EtcdClusterList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// Deep copies (what controller-gen writes into zz_generated.deepcopy.go).

func ptr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

func (in *EtcdClusterSpec) DeepCopyInto(out *EtcdClusterSpec) {
	*out = *in
	out.Version, out.StorageClass, out.StorageSize = ptr(in.Version), ptr(in.StorageClass), ptr(in.StorageSize)
	if in.Backup != nil {
		b := *in.Backup
		b.Enabled, b.Schedule, b.Retention, b.Destination = ptr(b.Enabled), ptr(b.Schedule), ptr(b.Retention), ptr(b.Destination)
		out.Backup = &b
	}
	if in.Restore != nil {
		r := *in.Restore
		r.SHA256 = ptr(r.SHA256)
		out.Restore = &r
	}
	if in.Maintenance != nil {
		m := *in.Maintenance
		m.QuotaBackendBytes, m.AutoCompactionRetention, m.DefragThresholdPercent = ptr(m.QuotaBackendBytes), ptr(m.AutoCompactionRetention), ptr(m.DefragThresholdPercent)
		out.Maintenance = &m
	}
	if in.TLS != nil {
		t := *in.TLS
		t.Enabled, t.Certificates = ptr(t.Enabled), ptr(t.Certificates)
		if t.IssuerRef != nil {
			i := *t.IssuerRef
			i.Kind, i.Group = ptr(i.Kind), ptr(i.Group)
			t.IssuerRef = &i
		}
		out.TLS = &t
	}
	if in.Recovery != nil {
		r := *in.Recovery
		r.QuorumLoss = ptr(r.QuorumLoss)
		out.Recovery = &r
	}
}

func (in *EtcdClusterStatus) DeepCopyInto(out *EtcdClusterStatus) {
	*out = *in
	out.ReadyReplicas, out.ObservedGeneration = ptr(in.ReadyReplicas), ptr(in.ObservedGeneration)
	if in.Endpoints != nil {
		out.Endpoints = append([]string(nil), in.Endpoints...)
	}
	if in.Conditions != nil {
		out.Conditions = make([]metav1.Condition, len(in.Conditions))
		for i := range in.Conditions {
			in.Conditions[i].DeepCopyInto(&out.Conditions[i])
		}
	}
	if in.Backup != nil {
		b := BackupStatus{}
		if in.Backup.Last != nil {
			l := *in.Backup.Last
			l.Keys = ptr(l.Keys)
			b.Last = &l
		}
		b.LastFailure = ptr(in.Backup.LastFailure)
		out.Backup = &b
	}
	if in.Members != nil {
		out.Members = make([]MemberState, len(in.Members))
		for i, m := range in.Members {
			m.DBSize, m.DBSizeInUse, m.LastDefragmentation = ptr(m.DBSize), ptr(m.DBSizeInUse), ptr(m.LastDefragmentation)
			if m.Alarms != nil {
				m.Alarms = append([]string(nil), m.Alarms...)
			}
			out.Members[i] = m
		}
	}
}

func (in *EtcdCluster) DeepCopyInto(out *EtcdCluster) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	in.Spec.DeepCopyInto(&out.Spec)
	in.Status.DeepCopyInto(&out.Status)
}

func (in *EtcdCluster) DeepCopyObject() runtime.Object {
	if in == nil {
		return nil
	}
	out := new(EtcdCluster)
	in.DeepCopyInto(out)
	return out
}

func (in *EtcdClusterList) DeepCopyObject() runtime.Object {
	if in == nil {
		return nil
	}
	out := new(EtcdClusterList)
	*out = *in
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		out.Items = make([]EtcdCluster, len(in.Items))
		for i := range in.Items {
			in.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
	return out
}
