package podcache

import (
	"bytes"
	"encoding/binary"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// LeanDecoding wraps the pod informer's serializer so that a v1 Pod sent in
// protobuf is decoded without what PodTransform drops before the generated
// decoder allocates it: every PodSpec field but priorityClassName and
// schedulingGroup, and of managedFields every entry but the status writes'
// subresource and time (the entries' fieldsV1 were the largest single
// allocation of the watch's decoding beside Kyverno's 2,000 removals;
// BENCHMARKS.md). The reduced message is built in a reused buffer and
// decoded into the pod directly, so that a pod's bytes are copied once, by
// the decoder, instead of three times.
// Everything else (other kinds, a pod decoded into another type, JSON,
// anything it cannot parse) is decoded as the wrapped serializer decodes it.
//
// It is for the informer and the read before an eviction only, whose
// transform keeps nothing else of the spec and managedFields: a pod read with
// it is not the pod (TestLeanDecodingKeepsDecisions).
func LeanDecoding(ns runtime.NegotiatedSerializer) runtime.NegotiatedSerializer {
	return leanNegotiator{ns}
}

type leanNegotiator struct{ runtime.NegotiatedSerializer }

func (n leanNegotiator) SupportedMediaTypes() []runtime.SerializerInfo {
	infos := n.NegotiatedSerializer.SupportedMediaTypes()
	out := make([]runtime.SerializerInfo, len(infos))
	for i, info := range infos {
		if info.MediaType == runtime.ContentTypeProtobuf && info.Serializer != nil {
			info.Serializer = leanPodSerializer{info.Serializer}
		}
		out[i] = info
	}
	return out
}

// leanPodSerializer decodes a protobuf v1 Pod lean (appendLeanPod); it
// encodes as the wrapped serializer does.
type leanPodSerializer struct{ runtime.Serializer }

var podKind = corev1.SchemeGroupVersion.WithKind("Pod")

// Decode does for a v1 Pod what the protobuf serializer's Decode does (the
// envelope's kind and version, the object unmarshalled into into when that is
// a Pod, else into a new one, its kind set), on the lean message.
func (s leanPodSerializer) Decode(data []byte, gvk *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	pod, isPod := into.(*corev1.Pod)
	raw, ok := podMessage(data)
	if !ok || (into != nil && !isPod) {
		return s.Serializer.Decode(data, gvk, into)
	}
	buf := leanBuffers.Get().(*[]byte)
	defer putLeanBuffer(buf)
	lean, ok := appendLeanPod((*buf)[:0], raw)
	if !ok {
		return s.Serializer.Decode(data, gvk, into)
	}
	*buf = lean
	if pod == nil {
		pod = &corev1.Pod{}
	}
	pod.Reset()
	actual := podKind
	// The generated Unmarshal copies every string and byte slice out of
	// lean, so the buffer is free again once it returns
	// (TestLeanDecodingDoesNotKeepItsBuffer).
	if err := pod.Unmarshal(lean); err != nil {
		return nil, &actual, err
	}
	pod.SetGroupVersionKind(actual)
	return pod, &actual, nil
}

// leanBuffers are the buffers that lean messages are built in; one larger
// than maxLeanBuffer (a pod of many statuses) is not kept.
var leanBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

const maxLeanBuffer = 64 << 10

func putLeanBuffer(b *[]byte) {
	if cap(*b) <= maxLeanBuffer {
		leanBuffers.Put(b)
	}
}

// protobufMagic opens every object Kubernetes encodes in protobuf, before its
// runtime.Unknown envelope.
var protobufMagic = []byte{0x6b, 0x38, 0x73, 0x00}

// Field numbers in k8s.io/apimachinery's runtime.Unknown, TypeMeta,
// ObjectMeta and ManagedFieldsEntry, and k8s.io/api/core/v1's Pod and PodSpec
// (generated.proto).
const (
	unknownTypeMeta          = 1
	unknownRaw               = 2
	typeMetaAPIVersion       = 1
	typeMetaKind             = 2
	podMetadata              = 1
	podSpec                  = 2
	podSpecPriorityClass     = 24
	podSpecSchedulingGroup   = 43
	metaManagedFields        = 17
	managedFieldsTime        = 4
	managedFieldsSubresource = 8
	statusSubresource        = "status"
)

// podMessage returns the Pod message inside data when data is a protobuf v1
// Pod, as Kubernetes writes it (one raw field); false otherwise.
func podMessage(data []byte) ([]byte, bool) {
	if !bytes.HasPrefix(data, protobufMagic) {
		return nil, false
	}
	var apiVersion, kind, raw []byte
	rawFields := 0
	ok := eachField(data[len(protobufMagic):], func(f field) bool {
		switch {
		case f.num == unknownTypeMeta && f.value != nil:
			return eachField(f.value, func(t field) bool {
				switch t.num {
				case typeMetaAPIVersion:
					apiVersion = t.value
				case typeMetaKind:
					kind = t.value
				}
				return true
			})
		case f.num == unknownRaw && f.value != nil:
			raw, rawFields = f.value, rawFields+1
		}
		return true
	})
	if !ok || rawFields != 1 || string(apiVersion) != "v1" || string(kind) != "Pod" {
		return nil, false
	}
	return raw, true
}

// appendLeanPod appends to out the Pod message pod without what PodTransform
// drops: of the spec, priorityClassName and schedulingGroup only; of managedFields, the entries
// of the status subresource, with their subresource and time only. Every
// other field is kept as it is, in its place. False: pod does not parse.
func appendLeanPod(out, pod []byte) ([]byte, bool) {
	return appendFields(out, pod, func(out []byte, f field) ([]byte, bool) {
		switch {
		case f.value == nil:
		case f.num == podMetadata:
			return appendMessage(out, podMetadata, f.value, appendLeanMetadata)
		case f.num == podSpec:
			return appendMessage(out, podSpec, f.value, func(out, spec []byte) ([]byte, bool) {
				return appendFields(out, spec, func(out []byte, sf field) ([]byte, bool) {
					if sf.num == podSpecPriorityClass || sf.num == podSpecSchedulingGroup { // the fields of the spec PodTransform keeps
						out = append(out, spec[sf.start:sf.end]...)
					}
					return out, true
				})
			})
		}
		return append(out, pod[f.start:f.end]...), true
	})
}

func appendLeanMetadata(out, meta []byte) ([]byte, bool) {
	return appendFields(out, meta, func(out []byte, f field) ([]byte, bool) {
		if f.num != metaManagedFields || f.value == nil {
			return append(out, meta[f.start:f.end]...), true
		}
		entry, status := f.value, false
		if !eachField(entry, func(ef field) bool {
			if ef.num == managedFieldsSubresource && string(ef.value) == statusSubresource {
				status = true
			}
			return true
		}) {
			return out, false
		}
		if !status {
			return out, true
		}
		return appendMessage(out, metaManagedFields, entry, func(out, entry []byte) ([]byte, bool) {
			return appendFields(out, entry, func(out []byte, ef field) ([]byte, bool) {
				if ef.num == managedFieldsTime || ef.num == managedFieldsSubresource {
					out = append(out, entry[ef.start:ef.end]...)
				}
				return out, true
			})
		})
	})
}

// appendFields calls fn with out and each field of msg in order, fn
// appending what it keeps; false when msg does not parse or fn says so.
func appendFields(out, msg []byte, fn func(out []byte, f field) ([]byte, bool)) ([]byte, bool) {
	ok := eachField(msg, func(f field) bool {
		var ok bool
		out, ok = fn(out, f)
		return ok
	})
	return out, ok
}

// appendMessage appends field num holding msg as lean rewrites it, which
// must write no more bytes than msg has: the length is written in the room
// msg's own length took, and what follows moves back should it take less.
func appendMessage(out []byte, num protowire.Number, msg []byte, lean func(out, msg []byte) ([]byte, bool)) ([]byte, bool) {
	out = protowire.AppendTag(out, num, protowire.BytesType)
	at, room := len(out), protowire.SizeVarint(uint64(len(msg)))
	var zeros [binary.MaxVarintLen64]byte
	out = append(out, zeros[:room]...)
	out, ok := lean(out, msg)
	n := len(out) - at - room
	size := binary.PutUvarint(out[at:at+room], uint64(n))
	if size < room {
		out = append(out[:at+size], out[at+room:]...)
	}
	return out, ok
}

// field is one field of a protobuf message: its number, where it lies in
// the message (tag included), and a length-delimited field's contents (nil
// for other wire types).
type field struct {
	num        protowire.Number
	start, end int
	value      []byte
}

// eachField calls fn with the fields of msg in order, until fn returns
// false; it reports false then, or when msg does not parse.
func eachField(msg []byte, fn func(field) bool) bool {
	for off := 0; off < len(msg); {
		num, typ, n := protowire.ConsumeTag(msg[off:])
		if n < 0 {
			return false
		}
		m := protowire.ConsumeFieldValue(num, typ, msg[off+n:])
		if m < 0 {
			return false
		}
		f := field{num: num, start: off, end: off + n + m}
		if typ == protowire.BytesType {
			if f.value, _ = protowire.ConsumeBytes(msg[off+n:]); f.value == nil {
				f.value = []byte{} // empty, not absent
			}
		}
		if !fn(f) {
			return false
		}
		off = f.end
	}
	return true
}
