package namespacecontroller

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/podjanitor/podjanitor/internal/wave"
)

// Record is where the leader keeps what it acted on of each namespace (its
// labels and the annotations decisions read, as namespaceJSON writes them):
// keys of the record ConfigMap beside the Lease (wave.RecordName). The next
// start measures a namespace that differs from it (changed while no
// podjanitor ran) as a change made while one ran. A Lease's annotations
// (256 KiB) are too small for a cluster's namespaces; a ConfigMap takes
// 1 MiB, gzipped.
type Record struct {
	Client          corev1client.ConfigMapsGetter
	Namespace, Name string
}

// The record's keys: recordKey its gzipped JSON (binaryData), or, when that
// would not fit, recordLeftOut the number of namespaces that were not
// recorded (and nothing else).
const (
	recordKey     = "namespaces.json.gz"
	recordLeftOut = "namespaces-not-recorded"
)

// maxRecord is the most recordKey takes: the API server takes 1 MiB of a
// ConfigMap's data, which the rest of the record (the policy acted on, the
// held namespace changes: wave.Record) shares.
var maxRecord = 800 << 10

// Acted is what the leader acted on of one namespace: the namespace (its
// UID, so that one deleted and made again under its name is told apart) and
// what decisions read of it (namespaceJSON).
type Acted struct {
	UID   types.UID       `json:"uid"`
	State json.RawMessage `json:"state"`
}

// ErrRecordTooLarge says the namespaces did not fit the record.
var ErrRecordTooLarge = errors.New("too many namespaces to record")

// ActedIn reads what the record cm (nil: none) says was acted on: nil and
// no error when it records none (a first install, hold waves just turned
// on); ErrRecordTooLarge when the last leader could not record its
// namespaces. A record that does not parse is an error wrapping
// wave.ErrBadRecord.
func ActedIn(cm *corev1.ConfigMap) (map[string]Acted, error) {
	if cm == nil {
		return nil, nil
	}
	b, ok := cm.BinaryData[recordKey]
	if !ok {
		if n, ok := cm.Data[recordLeftOut]; ok {
			return nil, fmt.Errorf("configmap %s/%s: %s namespaces: %w", cm.Namespace, cm.Name, n, ErrRecordTooLarge)
		}
		return nil, nil // the record's other parts alone: no namespace recorded yet
	}
	acted, err := decodeRecord(b)
	if err != nil {
		return nil, fmt.Errorf("configmap %s/%s: %w (delete it: no namespace change made while no podjanitor ran is then measured): %w",
			cm.Namespace, cm.Name, wave.ErrBadRecord, err)
	}
	return acted, nil
}

// Write makes the record acted: encoded, created or updated when it differs;
// the record's other keys (wave.Record's) are left as they are. It returns
// ErrRecordTooLarge (after recording that) when acted does not fit.
func (r Record) Write(ctx context.Context, encoded []byte, count int) error {
	err := wave.UpdateConfigMap(ctx, r.Client, r.Namespace, r.Name, func(cm *corev1.ConfigMap) {
		delete(cm.Data, recordLeftOut)
		delete(cm.BinaryData, recordKey)
		if len(encoded) > maxRecord {
			if cm.Data == nil {
				cm.Data = map[string]string{}
			}
			cm.Data[recordLeftOut] = strconv.Itoa(count)
			return
		}
		if cm.BinaryData == nil {
			cm.BinaryData = map[string][]byte{}
		}
		cm.BinaryData[recordKey] = encoded
	})
	if err != nil {
		return fmt.Errorf("recording the namespaces acted on in configmap %s/%s: %w", r.Namespace, r.Name, err)
	}
	if len(encoded) > maxRecord {
		return fmt.Errorf("configmap %s/%s: %d namespaces (%d bytes gzipped, over %d): %w", r.Namespace, r.Name, count, len(encoded), maxRecord, ErrRecordTooLarge)
	}
	return nil
}

// encodeRecord is acted as Write records it: JSON (its keys sorted, so
// that the same namespaces give the same bytes), gzipped.
func encodeRecord(acted map[string]Acted) ([]byte, error) {
	j, err := json.Marshal(acted)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	z := gzip.NewWriter(&b)
	if _, err := z.Write(j); err != nil {
		return nil, err
	}
	if err := z.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// maxRecordJSON bounds what a record may inflate to (a gzip bomb in a
// hand-made ConfigMap).
const maxRecordJSON = 64 << 20

func decodeRecord(b []byte) (map[string]Acted, error) {
	z, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	j, err := io.ReadAll(io.LimitReader(z, maxRecordJSON+1))
	if err != nil {
		return nil, err
	}
	if len(j) > maxRecordJSON {
		return nil, fmt.Errorf("inflates to more than %d bytes", maxRecordJSON)
	}
	var acted map[string]Acted
	if err := json.Unmarshal(j, &acted); err != nil {
		return nil, err
	}
	return acted, nil
}
