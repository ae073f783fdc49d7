package dialect

import (
	"encoding/json"
	"maps"
	"testing"
)

// decodeHeaders must agree with encoding/json on every input: same map, or
// both fail.
func FuzzDecodeHeaders(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"a": "b"}`, `{"tenant": "acme", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`,
		` { "a" : "b" , "c":"d" } `, `{"a": "b", "a": "c"}`, `{"é": "✓"}`, `{"a": "b\"c"}`, `{"a": "\u00e9"}`,
		`{"a": 1}`, `{"a": null}`, `{"a": "b",}`, `{"a" "b"}`, `{"a": "b"} x`, `[]`, `null`, `{`, `{"a": "b"`, "{\"a\": \"\xff\"}",
		"{\"a\": \"b\tc\"}", `{"": ""}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, gotErr := decodeHeaders(b)
		var want map[string]string
		wantErr := json.Unmarshal(b, &want)
		if (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("decodeHeaders(%q) error %v, encoding/json %v", b, gotErr, wantErr)
		}
		if gotErr == nil && !maps.Equal(got, want) {
			t.Fatalf("decodeHeaders(%q) = %v, encoding/json %v", b, got, want)
		}
	})
}
