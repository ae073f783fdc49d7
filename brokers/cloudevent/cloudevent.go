// Package cloudevent sends outbox events as CloudEvents 1.0, for consumers
// that expect that envelope (other languages' SDKs, Knative, EventBridge,
// Dapr). Every broker of this module takes an Options in its own options
// (CloudEvents) and the CLI a --cloudevents flag.
//
// Binary content mode (the default) keeps the event's payload as the
// message body and carries the attributes as headers, named as each
// protocol binding says: "cloudEvents:" application properties on AMQP,
// "ce_" headers on Kafka, "ce-" headers on NATS, and "ce-" message
// attributes on SNS (which has no binding of its own). Structured mode
// sends the whole event in the JSON event format, content type
// application/cloudevents+json. Either way the event's own headers
// (core.Event.MessageHeaders: event_id and the others) travel too, so that
// txoutbox's consumers and its inbox work as before.
//
// The attributes: id is the event ID, type the event type (Options.Type),
// source Options.Source, subject the aggregate ID, time the event's
// creation, datacontenttype application/json, data the payload. The
// CloudEvents SDK (github.com/cloudevents/sdk-go/v2) validates the event
// and writes the attributes and the JSON format; Decode reads them back
// with it.
package cloudevent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"

	"github.com/txoutbox/txoutbox/core"
)

// Mode is a CloudEvents content mode.
type Mode string

// The content modes.
const (
	// Binary keeps the payload as the body and puts the attributes in
	// headers.
	Binary Mode = "binary"
	// Structured sends the whole event in the JSON event format.
	Structured Mode = "structured"
)

// StructuredContentType is the content type of a structured-mode message.
const StructuredContentType = "application/cloudevents+json"

// Options turns events into CloudEvents.
type Options struct {
	// Source is every event's source attribute, a URI reference naming
	// the producer: "/orders", "urn:shop:orders",
	// "https://shop.example/orders". Required.
	Source string
	// Mode is the content mode. Default Binary.
	Mode Mode
	// Type maps an event to its type attribute. Default the event type.
	Type func(ev *core.Event) string
}

// Validate reports options that can never make a valid CloudEvent.
func (o *Options) Validate() error {
	if o.Source == "" {
		return fmt.Errorf("%w: cloudevent: Source is empty; name the producer (a URI reference such as /orders)", core.ErrInvalidOptions)
	}
	switch o.Mode {
	case "", Binary, Structured:
	default:
		return fmt.Errorf("%w: cloudevent: Mode %q is neither %q nor %q", core.ErrInvalidOptions, o.Mode, Binary, Structured)
	}
	e := event.New()
	e.SetID("x")
	e.SetType("x")
	e.SetSource(o.Source)
	if err := e.Validate(); err != nil {
		return fmt.Errorf("%w: cloudevent: Source %q: %w", core.ErrInvalidOptions, o.Source, err)
	}
	return nil
}

// Binding names the headers of one protocol binding in binary mode.
type Binding struct {
	// Name is the protocol's name, for errors.
	Name string
	// Prefix starts every attribute's header name.
	Prefix string
	// ContentTypeHeader is the header of datacontenttype in binary mode,
	// or "" where the protocol has a content-type property of its own
	// (AMQP), which the broker sets from Message.ContentType.
	ContentTypeHeader string
}

// The bindings of this module's brokers.
var (
	AMQP  = Binding{Name: "AMQP", Prefix: "cloudEvents:"}
	Kafka = Binding{Name: "Kafka", Prefix: "ce_", ContentTypeHeader: "content-type"}
	NATS  = Binding{Name: "NATS", Prefix: "ce-", ContentTypeHeader: "content-type"}
	SNS   = Binding{Name: "SNS", Prefix: "ce-", ContentTypeHeader: "content-type"}
)

// Message is an event encoded for one protocol.
type Message struct {
	// Headers are the message's headers: the event's own
	// (core.Event.MessageHeaders) and, in binary mode, the attributes.
	Headers map[string]string
	// Body is the payload (binary) or the JSON event (structured).
	Body []byte
	// ContentType is the body's content type.
	ContentType string
}

// Encode encodes ev as a CloudEvent for b. An event that makes no valid
// CloudEvent fails with an error wrapping core.ErrInvalidEvent.
func (o *Options) Encode(ev *core.Event, b Binding) (Message, error) {
	e := event.New()
	e.SetID(ev.ID)
	typ := ev.EventType
	if o.Type != nil {
		typ = o.Type(ev)
	}
	e.SetType(typ)
	e.SetSource(o.Source)
	if ev.AggregateID != "" {
		e.SetSubject(ev.AggregateID)
	}
	if !ev.CreatedAt.IsZero() {
		e.SetTime(ev.CreatedAt)
	}
	e.SetDataContentType(event.ApplicationJSON)
	// The payload is JSON already: data, not data_base64.
	e.DataEncoded = ev.Payload
	if err := e.Validate(); err != nil {
		return Message{}, fmt.Errorf("%w: cloudevent: event %s: %w", core.ErrInvalidEvent, ev.ID, err)
	}
	w := &writer{b: b, m: Message{Headers: ev.MessageHeaders()}}
	ctx := context.Background()
	if o.Mode == Structured {
		ctx = binding.WithForceStructured(ctx)
	} else {
		ctx = binding.WithForceBinary(ctx)
	}
	if _, err := binding.Write(ctx, binding.ToMessage(&e), w, w); err != nil {
		return Message{}, fmt.Errorf("%w: cloudevent: event %s: %w", core.ErrInvalidEvent, ev.ID, err)
	}
	if b.ContentTypeHeader != "" {
		w.m.Headers[b.ContentTypeHeader] = w.m.ContentType
	}
	return w.m, nil
}

// NewMessage is Encode as a Watermill message (UUID the event ID, metadata
// the headers, carrying ctx), for the brokers that marshal Watermill
// messages; it returns the content type beside it.
func (o *Options) NewMessage(ctx context.Context, ev *core.Event, b Binding) (*message.Message, string, error) {
	m, err := o.Encode(ev, b)
	if err != nil {
		return nil, "", err
	}
	msg := message.NewMessage(ev.ID, m.Body)
	for k, v := range m.Headers {
		msg.Metadata.Set(k, v)
	}
	msg.SetContext(ctx)
	return msg, m.ContentType, nil
}

// writer collects what the SDK writes: a structured event, or the
// attributes and data of a binary one.
type writer struct {
	b Binding
	m Message
}

func (w *writer) SetStructuredEvent(_ context.Context, f format.Format, r io.Reader) error {
	body, err := io.ReadAll(r)
	w.m.Body, w.m.ContentType = body, f.MediaType()
	return err
}

func (w *writer) Start(context.Context) error { return nil }
func (w *writer) End(context.Context) error   { return nil }

func (w *writer) SetData(r io.Reader) error {
	body, err := io.ReadAll(r)
	w.m.Body = body
	return err
}

func (w *writer) SetAttribute(a spec.Attribute, value any) error {
	s, err := types.Format(value)
	if err != nil {
		return err
	}
	if a.Kind() == spec.DataContentType {
		// Encode puts it in the binding's content-type header, if any.
		w.m.ContentType = s
		return nil
	}
	w.m.Headers[w.b.Prefix+a.Name()] = s
	return nil
}

func (w *writer) SetExtension(name string, value any) error {
	s, err := types.Format(value)
	if err != nil {
		return err
	}
	w.m.Headers[w.b.Prefix+name] = s
	return nil
}

// ErrNotCloudEvent marks a message that holds no CloudEvent: neither the
// structured content type nor a specversion header.
var ErrNotCloudEvent = errors.New("cloudevent: not a CloudEvent")

// Decode reads the CloudEvent of a message a broker delivered, with the
// SDK: the JSON event format when the content type is
// StructuredContentType, else the attributes in headers with b's prefix
// and the body as data. contentType is the protocol's content-type
// property (AMQP); "" takes b's content-type header.
func Decode(b Binding, headers map[string]string, body []byte, contentType string) (*event.Event, error) {
	if contentType == "" && b.ContentTypeHeader != "" {
		contentType = headers[b.ContentTypeHeader]
	}
	m := &reader{b: b, headers: headers, body: body, contentType: contentType}
	if m.ReadEncoding() == binding.EncodingUnknown {
		return nil, fmt.Errorf("%w (%s binding)", ErrNotCloudEvent, b.Name)
	}
	e, err := binding.ToEvent(context.Background(), m)
	if err != nil {
		return nil, fmt.Errorf("cloudevent: decode (%s binding): %w", b.Name, err)
	}
	return e, nil
}

// reader is a delivered message as the SDK's binding.MessageReader.
type reader struct {
	b           Binding
	headers     map[string]string
	body        []byte
	contentType string
}

func (r *reader) versions() *spec.Versions { return spec.WithPrefix(r.b.Prefix) }

func (r *reader) ReadEncoding() binding.Encoding {
	if format.Lookup(r.contentType) != nil && strings.HasPrefix(r.contentType, "application/cloudevents") {
		return binding.EncodingStructured
	}
	if _, ok := r.headers[r.versions().PrefixedSpecVersionName()]; ok {
		return binding.EncodingBinary
	}
	return binding.EncodingUnknown
}

func (r *reader) ReadStructured(ctx context.Context, w binding.StructuredWriter) error {
	f := format.Lookup(r.contentType)
	if f == nil || r.ReadEncoding() != binding.EncodingStructured {
		return binding.ErrNotStructured
	}
	return w.SetStructuredEvent(ctx, f, bytes.NewReader(r.body))
}

func (r *reader) ReadBinary(ctx context.Context, w binding.BinaryWriter) error {
	if r.ReadEncoding() != binding.EncodingBinary {
		return binding.ErrNotBinary
	}
	v := r.versions().Version(r.headers[r.versions().PrefixedSpecVersionName()])
	if v == nil {
		return binding.ErrUnknownEncoding
	}
	if err := w.Start(ctx); err != nil {
		return err
	}
	ct := r.contentType
	if r.b.ContentTypeHeader != "" {
		if h, ok := r.headers[r.b.ContentTypeHeader]; ok {
			ct = h
		}
	}
	if ct != "" {
		if err := w.SetAttribute(v.AttributeFromKind(spec.DataContentType), ct); err != nil {
			return err
		}
	}
	for k, val := range r.headers {
		if !strings.HasPrefix(k, r.b.Prefix) {
			continue
		}
		if a := v.Attribute(k); a != nil {
			if a.Kind() == spec.SpecVersion {
				continue
			}
			if err := w.SetAttribute(a, val); err != nil {
				return err
			}
			continue
		}
		if err := w.SetExtension(strings.ToLower(strings.TrimPrefix(k, r.b.Prefix)), val); err != nil {
			return err
		}
	}
	if len(r.body) > 0 {
		if err := w.SetData(bytes.NewReader(r.body)); err != nil {
			return err
		}
	}
	return w.End(ctx)
}

func (r *reader) Finish(error) error { return nil }

// GetAttribute returns a binary message's attribute of kind k, as the
// SDK's binding.MessageMetadataReader.
func (r *reader) GetAttribute(k spec.Kind) (spec.Attribute, any) {
	v := r.versions().Version(r.headers[r.versions().PrefixedSpecVersionName()])
	if v == nil {
		return nil, nil
	}
	a := v.AttributeFromKind(k)
	if a == nil {
		return nil, nil
	}
	if val, ok := r.headers[a.PrefixedName()]; ok {
		return a, val
	}
	return a, nil
}

// GetExtension returns a binary message's extension attribute name.
func (r *reader) GetExtension(name string) any {
	if val, ok := r.headers[r.b.Prefix+name]; ok {
		return val
	}
	return nil
}

var _ binding.Message = (*reader)(nil)
