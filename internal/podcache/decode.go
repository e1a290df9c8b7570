package podcache

import (
	"bytes"

	"google.golang.org/protobuf/encoding/protowire"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// LeanDecoding wraps the pod informer's serializer so that a v1 Pod sent in
// protobuf is decoded without the parts of its spec that PodTransform drops:
// every PodSpec field but priorityClassName is skipped in the bytes, before
// the generated decoder allocates containers, volumes and the rest only for
// the transform to throw them away (the decoding of whole specs was 0.48 s of
// the 8.8 s podjanitor spent beside Kyverno's 2,000 removals; BENCHMARKS.md).
// Everything else (metadata, status, other kinds, JSON, anything it cannot
// parse) is decoded as the wrapped serializer decodes it.
//
// It is for the informer only, whose transform keeps nothing else of the
// spec: a pod read with it is not the pod (TestLeanDecodingKeepsDecisions).
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

// leanPodSerializer decodes a protobuf v1 Pod without its spec but for
// priorityClassName; it encodes as the wrapped serializer does.
type leanPodSerializer struct{ runtime.Serializer }

func (s leanPodSerializer) Decode(data []byte, gvk *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	return s.Serializer.Decode(leanPodProtobuf(data), gvk, into)
}

// protobufMagic opens every object Kubernetes encodes in protobuf, before its
// runtime.Unknown envelope.
var protobufMagic = []byte{0x6b, 0x38, 0x73, 0x00}

// Field numbers in k8s.io/apimachinery's runtime.Unknown and TypeMeta, and
// k8s.io/api/core/v1's Pod and PodSpec (generated.proto).
const (
	unknownTypeMeta      = 1
	unknownRaw           = 2
	typeMetaAPIVersion   = 1
	typeMetaKind         = 2
	podSpec              = 2
	podSpecPriorityClass = 24
)

// leanPodProtobuf returns data with a v1 Pod's spec reduced to its
// priorityClassName, or data itself when it is not a protobuf v1 Pod or
// anything in it does not parse.
func leanPodProtobuf(data []byte) []byte {
	if !bytes.HasPrefix(data, protobufMagic) {
		return data
	}
	envelope := data[len(protobufMagic):]
	var apiVersion, kind []byte
	var raw field // raw.value nil: none yet
	ok := eachField(envelope, func(f field) bool {
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
			if raw.value != nil {
				return false // one raw, as Kubernetes writes it
			}
			raw = f
		}
		return true
	})
	if !ok || raw.value == nil || string(apiVersion) != "v1" || string(kind) != "Pod" {
		return data
	}
	lean, ok := leanPodMessage(raw.value)
	if !ok {
		return data
	}
	out := make([]byte, 0, len(data)-len(raw.value)+len(lean))
	out = append(out, protobufMagic...)
	out = append(out, envelope[:raw.start]...)
	out = protowire.AppendTag(out, unknownRaw, protowire.BytesType)
	out = protowire.AppendBytes(out, lean)
	return append(out, envelope[raw.end:]...)
}

// leanPodMessage returns a Pod message with its spec reduced to
// priorityClassName; every other field is kept as it is, in its place.
func leanPodMessage(pod []byte) ([]byte, bool) {
	out := make([]byte, 0, len(pod))
	ok := eachField(pod, func(f field) bool {
		if f.num != podSpec || f.value == nil {
			out = append(out, pod[f.start:f.end]...)
			return true
		}
		out = protowire.AppendTag(out, podSpec, protowire.BytesType)
		var kept []byte
		if !eachField(f.value, func(sf field) bool {
			if sf.num == podSpecPriorityClass { // the only field of the spec PodTransform keeps
				kept = append(kept, f.value[sf.start:sf.end]...)
			}
			return true
		}) {
			return false
		}
		out = protowire.AppendBytes(out, kept)
		return true
	})
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
