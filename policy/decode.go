package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"

	sigsjson "sigs.k8s.io/json"
)

// decodeStrict decodes JSON into v. Field names must match case-sensitively;
// unknown and duplicate fields and values of the wrong type are errors naming
// the field.
func decodeStrict(data []byte, v any) error {
	strictErrs, err := sigsjson.UnmarshalStrict(data, v)
	if err != nil {
		return describeDecodeError(err)
	}
	if len(strictErrs) > 0 {
		msgs := make([]string, len(strictErrs))
		for i, err := range strictErrs {
			msgs[i] = err.Error()
		}
		return errors.New(strings.Join(msgs, "; "))
	}
	return nil
}

// yamlError puts a YAML error on one line, starting "yaml: ":
// `yaml: unmarshal errors: line 7: key "name" already set in map`.
func yamlError(err error) error {
	msg := strings.ReplaceAll(strings.ReplaceAll(err.Error(), ":\n  ", ": "), "\n  ", "; ")
	if !strings.HasPrefix(msg, "yaml: ") {
		msg = "yaml: " + msg
	}
	return errors.New(msg)
}

// describeDecodeError turns "json: cannot unmarshal number into Go struct
// field ruleFile.match.phases of type []v1.PodPhase" into
// "match.phases: want a list, got number".
func describeDecodeError(err error) error {
	typeErr, ok := asTypeError(err)
	if !ok {
		return err
	}
	msg := fmt.Sprintf("want %s, got %s", describeType(typeErr.Type), typeErr.Value)
	if typeErr.Type.Kind() == reflect.String && (typeErr.Value == "bool" || strings.HasPrefix(typeErr.Value, "number")) {
		msg += " (quote the value)"
	}
	if typeErr.Field == "" {
		return errors.New(msg)
	}
	return fmt.Errorf("%s: %s", typeErr.Field, msg)
}

// asTypeError reads a json.UnmarshalTypeError, or sigs.k8s.io/json's copy of
// it, which lives in an internal package.
func asTypeError(err error) (*json.UnmarshalTypeError, bool) {
	if typeErr, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		return typeErr, true
	}
	v := reflect.ValueOf(err)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct || v.Elem().Type().Name() != "UnmarshalTypeError" {
		return nil, false
	}
	value, typ, field := v.Elem().FieldByName("Value"), v.Elem().FieldByName("Type"), v.Elem().FieldByName("Field")
	if value.Kind() != reflect.String || field.Kind() != reflect.String || !typ.IsValid() || typ.IsNil() {
		return nil, false
	}
	goType, ok := typ.Interface().(reflect.Type)
	if !ok {
		return nil, false
	}
	return &json.UnmarshalTypeError{Value: value.String(), Type: goType, Field: field.String()}, true
}

func describeType(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Pointer:
		return describeType(t.Elem())
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Struct, reflect.Map:
		return "a mapping"
	}
	return t.String()
}
