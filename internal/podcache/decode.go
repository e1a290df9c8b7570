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
	var apiVersion, kind, raw []byte
	rawStart, rawEnd := -1, -1
	for b := envelope; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return data
		}
		start := len(envelope) - len(b)
		b = b[n:]
		if typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return data
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return data
		}
		switch num {
		case unknownTypeMeta:
			var ok bool
			if apiVersion, kind, ok = typeMeta(v); !ok {
				return data
			}
		case unknownRaw:
			if rawStart >= 0 {
				return data // one raw, as Kubernetes writes it
			}
			raw, rawStart, rawEnd = v, start, len(envelope)-len(b)+n
		}
		b = b[n:]
	}
	if rawStart < 0 || string(apiVersion) != "v1" || string(kind) != "Pod" {
		return data
	}
	lean, ok := leanPodMessage(raw)
	if !ok {
		return data
	}
	out := make([]byte, 0, len(data)-len(raw)+len(lean))
	out = append(out, protobufMagic...)
	out = append(out, envelope[:rawStart]...)
	out = protowire.AppendTag(out, unknownRaw, protowire.BytesType)
	out = protowire.AppendBytes(out, lean)
	return append(out, envelope[rawEnd:]...)
}

// typeMeta reads a TypeMeta message's apiVersion and kind.
func typeMeta(b []byte) (apiVersion, kind []byte, ok bool) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, nil, false
		}
		b = b[n:]
		if typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return nil, nil, false
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil, nil, false
		}
		switch num {
		case typeMetaAPIVersion:
			apiVersion = v
		case typeMetaKind:
			kind = v
		}
		b = b[n:]
	}
	return apiVersion, kind, true
}

// leanPodMessage returns a Pod message with its spec reduced to
// priorityClassName; every other field is kept as it is, in its place.
func leanPodMessage(pod []byte) ([]byte, bool) {
	out := make([]byte, 0, len(pod))
	for b := pod; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false
		}
		field := b
		b = b[n:]
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return nil, false
		}
		whole := field[:len(field)-len(b)+n]
		if num != podSpec || typ != protowire.BytesType {
			out = append(out, whole...)
			b = b[n:]
			continue
		}
		spec, _ := protowire.ConsumeBytes(b)
		kept, ok := specPriorityClass(spec)
		if !ok {
			return nil, false
		}
		out = protowire.AppendTag(out, podSpec, protowire.BytesType)
		out = protowire.AppendBytes(out, kept)
		b = b[n:]
	}
	return out, true
}

// specPriorityClass returns the priorityClassName fields of a PodSpec
// message, the only ones PodTransform keeps.
func specPriorityClass(spec []byte) ([]byte, bool) {
	var kept []byte
	for b := spec; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false
		}
		field := b
		b = b[n:]
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return nil, false
		}
		if num == podSpecPriorityClass {
			kept = append(kept, field[:len(field)-len(b)+n]...)
		}
		b = b[n:]
	}
	return kept, true
}
