package namespacecontroller

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/util/retry"

	"github.com/podjanitor/podjanitor/internal/wave"
)

// Record is where the leader keeps what it acted on of each namespace (its
// labels and the annotations decisions read, as namespaceJSON writes them):
// a ConfigMap beside the record Lease, RecordName of its name. The next
// start measures a namespace that differs from it (changed while no
// podjanitor ran) as a change made while one ran. A Lease's annotations
// (256 KiB) are too small for a cluster's namespaces; a ConfigMap takes
// 1 MiB, gzipped.
type Record struct {
	Client          corev1client.ConfigMapsGetter
	Namespace, Name string
}

// RecordName is the name of the ConfigMap of the Lease lease.
func RecordName(lease string) string { return lease + recordSuffix }

const recordSuffix = "-namespaces"

// MaxLeaseName is the longest Lease name whose record's name is still a
// valid object name (253 characters).
const MaxLeaseName = 253 - len(recordSuffix)

// The record's keys: recordKey its gzipped JSON (binaryData), or, when that
// would not fit, recordLeftOut the number of namespaces that were not
// recorded (and nothing else).
const (
	recordKey     = "namespaces.json.gz"
	recordLeftOut = "namespaces-not-recorded"
)

// maxRecord is the most recordKey takes: the API server takes 1 MiB of a
// ConfigMap's data.
var maxRecord = 1000 << 10

// Acted is what the leader acted on of one namespace: the namespace (its
// UID, so that one deleted and made again under its name is told apart) and
// what decisions read of it (namespaceJSON).
type Acted struct {
	UID   types.UID       `json:"uid"`
	State json.RawMessage `json:"state"`
}

// ErrRecordTooLarge says the namespaces did not fit the record.
var ErrRecordTooLarge = errors.New("too many namespaces to record")

// Read reads the record: nil and no error when there is none (a first
// install, hold waves just turned on); ErrRecordTooLarge when the last
// leader could not record its namespaces. A record that does not parse is
// an error wrapping wave.ErrBadRecord.
func (r Record) Read(ctx context.Context) (map[string]Acted, error) {
	cm, err := r.Client.ConfigMaps(r.Namespace).Get(ctx, r.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading configmap %s/%s: %w", r.Namespace, r.Name, err)
	}
	b, ok := cm.BinaryData[recordKey]
	if !ok {
		if n, ok := cm.Data[recordLeftOut]; ok {
			return nil, fmt.Errorf("configmap %s/%s: %s namespaces: %w", r.Namespace, r.Name, n, ErrRecordTooLarge)
		}
		return nil, r.bad(errors.New("no " + recordKey))
	}
	acted, err := decodeRecord(b)
	if err != nil {
		return nil, r.bad(err)
	}
	return acted, nil
}

func (r Record) bad(err error) error {
	return fmt.Errorf("configmap %s/%s: %w (delete it: no namespace change made while no podjanitor ran is then measured): %w",
		r.Namespace, r.Name, wave.ErrBadRecord, err)
}

// Write makes the record acted: encoded, created or updated when it differs.
// It returns ErrRecordTooLarge (after recording that) when acted does not
// fit.
func (r Record) Write(ctx context.Context, encoded []byte, count int) error {
	cms := r.Client.ConfigMaps(r.Namespace)
	want := func(cm *corev1.ConfigMap) {
		cm.Data, cm.BinaryData = nil, nil
		if len(encoded) > maxRecord {
			cm.Data = map[string]string{recordLeftOut: strconv.Itoa(count)}
		} else {
			cm.BinaryData = map[string][]byte{recordKey: encoded}
		}
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := cms.Get(ctx, r.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: r.Name,
				Labels: map[string]string{"app.kubernetes.io/managed-by": "podjanitor"}}}
			want(cm)
			_, err = cms.Create(ctx, cm, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(corev1.Resource("configmaps"), r.Name, err)
			}
			return err
		}
		if err != nil {
			return err
		}
		before := cm.DeepCopy()
		want(cm)
		if reflect.DeepEqual(before.Data, cm.Data) && reflect.DeepEqual(before.BinaryData, cm.BinaryData) {
			return nil
		}
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		return err
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
