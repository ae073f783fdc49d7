package snsbroker

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"

	"github.com/txoutbox/txoutbox/core"
)

// SNS limits the publisher respects.
const (
	// MaxAttributes is the most message attributes SNS delivers to SQS: a
	// message with more is not delivered to a raw-delivery SQS subscription.
	MaxAttributes = 10
	// MaxBatchEntries is the most entries one PublishBatch call takes.
	MaxBatchEntries = 10
	// MaxMessageBytes is the largest message SNS accepts, body and
	// attributes together; it is also the limit of a whole PublishBatch.
	MaxMessageBytes = 256 * 1024
	// DefaultOverflowAttribute is the attribute that carries, as one JSON
	// object, the headers that cannot travel as attributes of their own.
	DefaultOverflowAttribute = "txoutbox_headers"
)

// identityHeaders get attributes of their own before any other header, so
// that subscription filter policies can always match on them.
var identityHeaders = []string{core.HeaderEventID, core.HeaderEventType, core.HeaderAggregateType, core.HeaderAggregateID}

// encodeAttributes turns headers into SNS message attributes of data type
// String. When every header is a valid attribute and they fit in max, each
// gets its own attribute. Otherwise the identity headers and then the other
// headers in name order take max-1 attributes, and the rest (and every header
// that cannot be an attribute: invalid name, empty value, characters SNS
// refuses) go into the overflow attribute as a JSON object. Nothing is
// dropped. It returns the attributes and their size as SNS counts it.
func encodeAttributes(h map[string]string, max int, overflow string) (map[string]types.MessageAttributeValue, int, error) {
	direct := make([]string, 0, len(h))
	packed := map[string]string{}
	for k, v := range h {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			// JSON would replace the bad bytes and change the header.
			return nil, 0, fmt.Errorf("%w: header %q is not valid UTF-8", ErrInvalidHeader, k)
		}
		if k != overflow && validAttributeName(k) && validAttributeValue(v) {
			direct = append(direct, k)
		} else {
			packed[k] = v
		}
	}
	slices.SortFunc(direct, func(a, b string) int {
		ra, rb := identityRank(a), identityRank(b)
		if ra != rb {
			return ra - rb
		}
		return strings.Compare(a, b)
	})
	if len(packed) > 0 || len(direct) > max {
		keep := min(len(direct), max-1)
		for _, k := range direct[keep:] {
			packed[k] = h[k]
		}
		direct = direct[:keep]
	}
	attrs := make(map[string]types.MessageAttributeValue, len(direct)+1)
	size := 0
	for _, k := range direct {
		attrs[k] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(h[k])}
		size += len(k) + len("String") + len(h[k])
	}
	if len(packed) > 0 {
		b, err := json.Marshal(packed)
		if err != nil {
			return nil, 0, fmt.Errorf("%w: pack headers: %w", ErrInvalidHeader, err)
		}
		// json.Marshal escapes control characters but not U+FFFE and
		// U+FFFF, which XML (and so SNS) refuses; they can only be inside
		// JSON strings, where the escape means the same.
		js := strings.NewReplacer("\uFFFE", `\ufffe`, "\uFFFF", `\uffff`).Replace(string(b))
		attrs[overflow] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(js)}
		size += len(overflow) + len("String") + len(js)
	}
	return attrs, size, nil
}

func identityRank(k string) int {
	if i := slices.Index(identityHeaders, k); i >= 0 {
		return i
	}
	return len(identityHeaders)
}

// validAttributeName applies SNS's rules for attribute names.
func validAttributeName(k string) bool {
	if k == "" || len(k) > 256 || k[0] == '.' || k[len(k)-1] == '.' || strings.Contains(k, "..") {
		return false
	}
	lk := strings.ToLower(k)
	if strings.HasPrefix(lk, "aws.") || strings.HasPrefix(lk, "amazon.") {
		return false
	}
	for _, c := range k {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-', c == '.':
		default:
			return false
		}
	}
	return true
}

// validAttributeValue applies SNS's rules for String values: not empty, and
// only the characters XML allows.
func validAttributeValue(v string) bool {
	if v == "" {
		return false
	}
	for _, c := range v {
		if !validXMLChar(c) {
			return false
		}
	}
	return true
}

func validXMLChar(c rune) bool {
	return c == 0x9 || c == 0xA || c == 0xD ||
		(c >= 0x20 && c <= 0xD7FF) || (c >= 0xE000 && c <= 0xFFFD) || (c >= 0x10000 && c <= 0x10FFFF)
}

// DecodeHeaders restores the headers a Publisher sent from the message
// attributes a subscriber received (name to string value): every attribute
// except the overflow attribute, plus the headers packed into it. An empty
// overflow selects DefaultOverflowAttribute. Consumers reading SQS call it on
// the message attributes (raw delivery) or on Notification.Attributes (the
// SNS envelope).
func DecodeHeaders(attrs map[string]string, overflow string) (map[string]string, error) {
	if overflow == "" {
		overflow = DefaultOverflowAttribute
	}
	h := make(map[string]string, len(attrs))
	for k, v := range attrs {
		if k != overflow {
			h[k] = v
		}
	}
	if packed, ok := attrs[overflow]; ok {
		var extra map[string]string
		if err := json.Unmarshal([]byte(packed), &extra); err != nil {
			return nil, fmt.Errorf("%w: attribute %s: %w", ErrInvalidHeader, overflow, err)
		}
		for k, v := range extra {
			h[k] = v
		}
	}
	return h, nil
}

// Notification is the JSON envelope SNS wraps around a message it delivers
// to an SQS queue (or HTTP endpoint) without raw message delivery.
// Field names are SNS's own, as in its JSON.
type Notification struct {
	// Type is "Notification" for a published message.
	Type string
	// MessageId is the ID SNS gave the message (not the event ID).
	MessageId string
	// TopicArn is the topic the message was published to.
	TopicArn string
	// Subject is the optional subject; the publisher sets none.
	Subject string `json:",omitempty"`
	// Message is the published body: the event payload.
	Message string
	// Timestamp is when SNS accepted the message (RFC 3339).
	Timestamp string
	// MessageAttributes are the message attributes by name.
	MessageAttributes map[string]NotificationAttribute `json:",omitempty"`
}

// NotificationAttribute is one message attribute inside a Notification.
type NotificationAttribute struct {
	// Type is the attribute's data type, "String" for the publisher's.
	Type string
	// Value is the attribute's value.
	Value string
}

// ParseNotification decodes an SNS envelope, as found in the body of an SQS
// message from a subscription without raw message delivery.
func ParseNotification(body []byte) (*Notification, error) {
	var n Notification
	if err := json.Unmarshal(body, &n); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotNotification, err)
	}
	if n.Type != "Notification" || n.TopicArn == "" {
		return nil, fmt.Errorf("%w: Type %q, TopicArn %q", ErrNotNotification, n.Type, n.TopicArn)
	}
	return &n, nil
}

// Attributes returns the notification's message attributes as names to
// values, ready for DecodeHeaders.
func (n *Notification) Attributes() map[string]string {
	m := make(map[string]string, len(n.MessageAttributes))
	for k, a := range n.MessageAttributes {
		m[k] = a.Value
	}
	return m
}
