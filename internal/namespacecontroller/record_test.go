package namespacecontroller

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/podjanitor/podjanitor/internal/wave"
)

func testRecord() Record {
	return Record{Client: fake.NewClientset().CoreV1(), Namespace: "podjanitor", Name: wave.RecordName("podjanitor")}
}

// readBack reads r's ConfigMap as a start does (ActedIn).
func readBack(ctx context.Context, r Record) (map[string]Acted, error) {
	cm, err := r.Client.ConfigMaps(r.Namespace).Get(ctx, r.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return ActedIn(nil)
	}
	if err != nil {
		return nil, err
	}
	return ActedIn(cm)
}

// TestRecordKeepsTheOtherKeys: the namespaces' write leaves the record's
// other parts (the policy acted on, the held namespace changes) as they
// are.
func TestRecordKeepsTheOtherKeys(t *testing.T) {
	ctx := context.Background()
	r := testRecord()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: r.Name},
		Data: map[string]string{wave.KeyPolicy: `{"Rules":null}`, wave.KeyHeldNamespaces: "{}"}}
	if _, err := r.Client.ConfigMaps(r.Namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, err := readBack(ctx, r); err != nil || got != nil {
		t.Fatalf("the other parts alone: %v, %v; want no namespace recorded", got, err)
	}
	acted := actedOf(3)
	b, _ := encodeRecord(acted)
	if err := r.Write(ctx, b, len(acted)); err != nil {
		t.Fatal(err)
	}
	got, err := r.Client.ConfigMaps(r.Namespace).Get(ctx, r.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Data[wave.KeyPolicy] != cm.Data[wave.KeyPolicy] || got.Data[wave.KeyHeldNamespaces] != "{}" || len(got.BinaryData[recordKey]) == 0 {
		t.Errorf("after the namespaces' write: data %v, binary keys %d; want the other keys kept", got.Data, len(got.BinaryData))
	}
}

func actedOf(n int) map[string]Acted {
	acted := map[string]Acted{}
	for i := range n {
		name := fmt.Sprintf("team-%d", i)
		m := &metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/metadata.name": name, "tier": "dev"}}
		acted[name] = Acted{UID: types.UID(fmt.Sprintf("uid-%08d", i)), State: namespaceJSON(m, "")}
	}
	return acted
}

// TestRecordRoundTrip: what is written is read back; none written reads
// as none.
func TestRecordRoundTrip(t *testing.T) {
	ctx := context.Background()
	r := testRecord()
	if got, err := readBack(ctx, r); err != nil || got != nil {
		t.Fatalf("no record: %v, %v; want none", got, err)
	}
	acted := actedOf(3)
	b, err := encodeRecord(acted)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Write(ctx, b, len(acted)); err != nil {
		t.Fatal(err)
	}
	got, err := readBack(ctx, r)
	if err != nil || len(got) != 3 || got["team-1"].UID != "uid-00000001" || string(got["team-1"].State) != string(acted["team-1"].State) {
		t.Fatalf("read %v, %v; want what was written", got, err)
	}
}

// TestRecordTooLarge: namespaces over the ConfigMap's size are not
// recorded, and the record says so (a start then measures none), rather
// than a record of some; a later record that fits replaces it.
func TestRecordTooLarge(t *testing.T) {
	ctx := context.Background()
	r := testRecord()
	defer func(m int) { maxRecord = m }(maxRecord)
	maxRecord = 100
	acted := actedOf(50)
	b, _ := encodeRecord(acted)
	if err := r.Write(ctx, b, len(acted)); !errors.Is(err, ErrRecordTooLarge) {
		t.Fatalf("write: %v, want ErrRecordTooLarge", err)
	}
	if _, err := readBack(ctx, r); !errors.Is(err, ErrRecordTooLarge) {
		t.Fatalf("read: %v, want ErrRecordTooLarge", err)
	}
	maxRecord = 1 << 20
	if err := r.Write(ctx, b, len(acted)); err != nil {
		t.Fatal(err)
	}
	if got, err := readBack(ctx, r); err != nil || len(got) != 50 {
		t.Fatalf("read %d, %v; want 50", len(got), err)
	}
}

// TestRecordSize: 10,000 namespaces with two labels each fit the record
// (docs/policy.md: about 30,000 fit).
func TestRecordSize(t *testing.T) {
	acted := actedOf(10000)
	for name, a := range acted {
		a.UID = uuid.NewUUID() // random, as the API server's: they do not compress
		acted[name] = a
	}
	b, err := encodeRecord(acted)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > maxRecord/2 {
		t.Errorf("10,000 namespaces take %d bytes gzipped, want at most half of %d", len(b), maxRecord)
	}
	t.Logf("10,000 namespaces: %d bytes gzipped", len(b))
}

// BenchmarkRecordEncode: the leader's cost of one write of the record at
// 10,000 namespaces (made at most once every actedInterval, and only after
// a namespace changed).
func BenchmarkRecordEncode(b *testing.B) {
	acted := actedOf(10000)
	for name, a := range acted {
		a.UID = uuid.NewUUID()
		acted[name] = a
	}
	for b.Loop() {
		if _, err := encodeRecord(acted); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRecordInflateBound: a hand-made record that inflates past
// maxRecordJSON (a gzip bomb from whoever may write podjanitor's namespace)
// is refused as one that does not parse, reading no more than the bound.
func TestRecordInflateBound(t *testing.T) {
	var b bytes.Buffer
	z := gzip.NewWriter(&b)
	if _, err := io.CopyN(z, zeros{}, maxRecordJSON+1); err != nil {
		t.Fatal(err)
	}
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	r := testRecord()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: r.Name},
		BinaryData: map[string][]byte{recordKey: b.Bytes()}}
	if _, err := r.Client.ConfigMaps(r.Namespace).Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := readBack(context.Background(), r); !errors.Is(err, wave.ErrBadRecord) {
		t.Fatalf("read of %d gzipped bytes inflating past %d: %v, want ErrBadRecord", b.Len(), maxRecordJSON, err)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
