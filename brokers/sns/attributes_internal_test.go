package snsbroker

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"
)

func values(attrs map[string]types.MessageAttributeValue) map[string]string {
	m := map[string]string{}
	for k, v := range attrs {
		if aws.ToString(v.DataType) != "String" {
			panic("data type " + aws.ToString(v.DataType))
		}
		m[k] = aws.ToString(v.StringValue)
	}
	return m
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	many := map[string]string{"event_id": "e", "event_type": "t", "aggregate_type": "a", "aggregate_id": "i"}
	for i := range 20 {
		many[fmt.Sprintf("h%02d", i)] = fmt.Sprint(i)
	}
	for name, h := range map[string]map[string]string{
		"none":      {},
		"few":       {"event_id": "e", "tenant": "t1"},
		"ten":       {"event_id": "e", "a1": "1", "a2": "2", "a3": "3", "a4": "4", "a5": "5", "a6": "6", "a7": "7", "a8": "8", "a9": "9"},
		"many":      many,
		"empty":     {"event_id": "e", "blank": ""},
		"badname":   {"event_id": "e", "x y": "1", "amazon.k": "2", ".dot": "3", "a..b": "4", strings.Repeat("n", 257): "5"},
		"badvalue":  {"event_id": "e", "ctl": "\x00\x1f", "nonchar": "\uFFFE"},
		"spoof":     {"event_id": "e", DefaultOverflowAttribute: `{"event_id":"forged"}`},
		"unicode":   {"event_id": "e", "name": "Zoë — 東京 🚀"},
		"jsonvalue": {"event_id": "e", "payload": `{"a":[1,2]}`},
	} {
		t.Run(name, func(t *testing.T) {
			attrs, size, err := encodeAttributes(h, MaxAttributes, DefaultOverflowAttribute)
			if err != nil {
				t.Fatal(err)
			}
			if len(attrs) > MaxAttributes {
				t.Errorf("%d attributes", len(attrs))
			}
			want := 0
			for k, v := range attrs {
				want += len(k) + len("String") + len(aws.ToString(v.StringValue))
				if !validAttributeName(k) || !validAttributeValue(aws.ToString(v.StringValue)) {
					t.Errorf("attribute %q = %q is not valid for SNS", k, aws.ToString(v.StringValue))
				}
			}
			if size != want {
				t.Errorf("size %d, want %d", size, want)
			}
			got, err := DecodeHeaders(values(attrs), "")
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got, h) {
				t.Errorf("round trip\n got %v\nwant %v", got, h)
			}
		})
	}
}

func TestEncodeKeepsIdentityFirst(t *testing.T) {
	h := map[string]string{"aggregate_id": "i", "aggregate_type": "a", "event_id": "e", "event_type": "t"}
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g"} {
		h[k] = "v"
	}
	attrs, _, err := encodeAttributes(h, MaxAttributes, DefaultOverflowAttribute)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"event_id", "event_type", "aggregate_type", "aggregate_id", "a", "b", "c", "d", "e", DefaultOverflowAttribute} {
		if _, ok := attrs[k]; !ok {
			t.Errorf("attribute %s missing: %v", k, values(attrs))
		}
	}
	// With MaxAttributes 5 only the identity and the overflow remain.
	attrs, _, err = encodeAttributes(h, 5, DefaultOverflowAttribute)
	if err != nil {
		t.Fatal(err)
	}
	if len(attrs) != 5 || attrs["event_id"].StringValue == nil || attrs[DefaultOverflowAttribute].StringValue == nil {
		t.Errorf("MaxAttributes 5: %v", values(attrs))
	}
}

func TestEncodeRejectsInvalidUTF8(t *testing.T) {
	for _, h := range []map[string]string{{"k": "\xff"}, {"\xfe": "v"}} {
		if _, _, err := encodeAttributes(h, MaxAttributes, DefaultOverflowAttribute); !errors.Is(err, ErrInvalidHeader) {
			t.Errorf("%q: %v, want ErrInvalidHeader", h, err)
		}
	}
}

func TestDecodeHeadersBadOverflow(t *testing.T) {
	if _, err := DecodeHeaders(map[string]string{DefaultOverflowAttribute: "not json"}, ""); !errors.Is(err, ErrInvalidHeader) {
		t.Errorf("got %v, want ErrInvalidHeader", err)
	}
	h, err := DecodeHeaders(map[string]string{"custom": `{"a":"b"}`, "x": "y"}, "custom")
	if err != nil || !maps.Equal(h, map[string]string{"a": "b", "x": "y"}) {
		t.Errorf("custom overflow name: %v, %v", h, err)
	}
}

func TestTopicName(t *testing.T) {
	for in, want := range map[string]string{
		"order.created":      "order_created",
		"order-created_v2":   "order-created_v2",
		"orders.fifo":        "orders.fifo",
		"order.created.fifo": "order_created.fifo",
		"a/b c:d":            "a_b_c_d",
		"zoë":                "zo__",
	} {
		if got := TopicName(in); got != want {
			t.Errorf("TopicName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseNotification(t *testing.T) {
	n, err := ParseNotification([]byte(`{"Type":"Notification","MessageId":"m","TopicArn":"arn:aws:sns:r:1:t","Message":"{\"a\":1}",
		"MessageAttributes":{"event_id":{"Type":"String","Value":"e"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if n.Message != `{"a":1}` || n.Attributes()["event_id"] != "e" {
		t.Errorf("parsed %+v", n)
	}
	for _, body := range []string{`{"a":1}`, `not json`, `{"Type":"SubscriptionConfirmation","TopicArn":"x"}`} {
		if _, err := ParseNotification([]byte(body)); !errors.Is(err, ErrNotNotification) {
			t.Errorf("%s: %v, want ErrNotNotification", body, err)
		}
	}
}
