package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestCRDUpToDate: the CRD in artifacts/crd and in the chart's files/ are
// both what crdgen generates from the types now (hack/verify-codegen.sh
// checks the rest of the generated code).
func TestCRDUpToDate(t *testing.T) {
	root := filepath.Join("..", "..")
	want, err := generate(filepath.Join(root, typesDir))
	if err != nil {
		t.Fatal(err)
	}
	for _, out := range outputs {
		got, err := os.ReadFile(filepath.Join(root, out))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run hack/update-codegen.sh (or go run ./hack/crdgen)", out)
		}
	}
}

// TestCRDCoversEveryField: a field of the types without a bound, or a
// validation for a field the types do not have, fails the generation.
func TestCRDCoversEveryField(t *testing.T) {
	validations["spec.rules[].nosuchfield"] = cel(rule("true"))
	defer delete(validations, "spec.rules[].nosuchfield")
	if _, err := generate(filepath.Join("..", "..", typesDir)); err == nil {
		t.Error("a validation for a field the types do not have was accepted")
	}
}
