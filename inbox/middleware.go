package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/txoutbox/txoutbox/core"
)

// MissingEventIDPolicy says what the middleware does with a message that
// carries no event ID. No policy ever runs the handler twice for one event
// silently: the only one that gives up deduplication must be chosen by name.
type MissingEventIDPolicy int

const (
	// RejectMissingEventID, the default, does not run the handler and
	// returns an error wrapping core.ErrMissingEventID. The router nacks the
	// message; put Watermill's PoisonQueue (or PoisonQueueWithFilter with
	// IsMissingEventID) in front of the inbox to move it to a poison topic
	// instead of redelivering it forever.
	RejectMissingEventID MissingEventIDPolicy = iota
	// UseMessageUUID deduplicates on the Watermill message UUID instead. Use
	// it only for producers that set a stable UUID per event (txoutbox's
	// relay sets both, so it never needs this); a UUID generated per
	// delivery deduplicates nothing.
	UseMessageUUID
	// ProcessWithoutDedup runs the handler outside the inbox: no
	// transaction, no record, so a redelivered message takes effect again.
	// Tx and Txx return nil in such a handler. Each such message is logged
	// as a warning.
	ProcessWithoutDedup
)

// String names the policy, for logs and flags.
func (p MissingEventIDPolicy) String() string {
	switch p {
	case RejectMissingEventID:
		return "reject"
	case UseMessageUUID:
		return "use-message-uuid"
	case ProcessWithoutDedup:
		return "process-without-dedup"
	}
	return fmt.Sprintf("MissingEventIDPolicy(%d)", int(p))
}

// Options configures the middleware.
type Options struct {
	// Consumer names the consumer: the unit of deduplication. Every
	// instance of one service reading one stream uses the same name; two
	// services that both react to an event use different names, so that
	// each takes effect once. Required.
	Consumer string
	// MetadataKey is the metadata entry that holds the event ID. Default
	// core.HeaderEventID ("event_id"), which the relay sets; with the
	// default, a message without it that is a CloudEvent is deduplicated
	// on the CloudEvent's id: its ce-id (ce_id, cloudEvents:id) metadata in
	// binary content mode, the id of its JSON body in structured mode.
	MetadataKey string
	// MissingEventID is the policy for messages without an event ID.
	// Default RejectMissingEventID.
	MissingEventID MissingEventIDPolicy
	// OnDuplicate, if set, is called for every delivery the inbox absorbs:
	// its event was processed before, so the handler did not run and the
	// message is acked. metrics.Metrics.InboxDuplicate counts them. It must
	// not block.
	OnDuplicate func(ctx context.Context, consumer, eventID string)
	// Logger receives duplicates (debug) and messages without an event ID.
	// Default slog.Default().
	Logger *slog.Logger
}

// IsMissingEventID reports whether err is the middleware's rejection of a
// message without an event ID. It fits middleware.PoisonQueueWithFilter, to
// send those messages (and only those) to a poison topic.
func IsMissingEventID(err error) bool { return errors.Is(err, core.ErrMissingEventID) }

// NewMiddleware returns a Watermill router middleware that runs each
// message's handler at most once per (Options.Consumer, event ID), through ib.
//
// For a message whose event was already processed the handler does not run
// and the middleware returns no messages and no error, so the router acks it.
// Otherwise the handler runs with the inbox's transaction in the message's
// context (msg.Context(); see Tx, Txx and gorminbox.Tx), and its writes
// commit together with the record. A handler error rolls both back and is
// returned, so the router nacks the message for redelivery.
//
// Messages the handler returns are published by the router after the commit,
// so they may be lost if the process dies in between; a handler that must
// emit events reliably enqueues them into an outbox in the same transaction
// instead.
//
// Place it after middleware.Retry and PoisonQueue (AddMiddleware(poison,
// retry, inbox)), so that each retry is a fresh transaction.
func NewMiddleware(ib core.Inbox, opts Options) (message.HandlerMiddleware, error) {
	if ib == nil {
		return nil, fmt.Errorf("%w: inbox.NewMiddleware needs a core.Inbox", core.ErrInvalidOptions)
	}
	if strings.TrimSpace(opts.Consumer) == "" {
		return nil, fmt.Errorf("%w: inbox.Options.Consumer is empty; name the consumer (the unit of deduplication)", core.ErrInvalidOptions)
	}
	switch opts.MissingEventID {
	case RejectMissingEventID, UseMessageUUID, ProcessWithoutDedup:
	default:
		return nil, fmt.Errorf("%w: unknown inbox.Options.MissingEventID %v", core.ErrInvalidOptions, opts.MissingEventID)
	}
	if opts.MetadataKey == "" {
		opts.MetadataKey = core.HeaderEventID
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	m := &middleware{ib: ib, opts: opts, log: opts.Logger.With("consumer", opts.Consumer)}
	return m.wrap, nil
}

type middleware struct {
	ib   core.Inbox
	opts Options
	log  *slog.Logger
}

func (m *middleware) wrap(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		id := strings.TrimSpace(msg.Metadata.Get(m.opts.MetadataKey))
		if id == "" && m.opts.MetadataKey == core.HeaderEventID {
			id = cloudEventID(msg)
		}
		if id == "" {
			switch m.opts.MissingEventID {
			case UseMessageUUID:
				id = strings.TrimSpace(msg.UUID)
			case ProcessWithoutDedup:
				m.log.Warn("txoutbox: message without event id processed without deduplication",
					"message_uuid", msg.UUID, "metadata_key", m.opts.MetadataKey)
				return h(msg)
			}
			if id == "" {
				m.log.Error("txoutbox: message without event id rejected",
					"message_uuid", msg.UUID, "metadata_key", m.opts.MetadataKey)
				return nil, fmt.Errorf("inbox: consumer %q: message %s: %w (metadata %q)",
					m.opts.Consumer, msg.UUID, core.ErrMissingEventID, m.opts.MetadataKey)
			}
		}

		// The handler sees the transaction through the message's context;
		// the original context is put back afterwards so that middleware
		// outside the inbox (a retry, a poison queue) never sees a
		// transaction that is already finished.
		orig := msg.Context()
		defer msg.SetContext(orig)
		var produced []*message.Message
		processed, err := m.ib.Process(orig, m.opts.Consumer, id, func(ctx context.Context) error {
			msg.SetContext(ctx)
			var herr error
			produced, herr = h(msg)
			return herr
		})
		if err != nil {
			return nil, fmt.Errorf("inbox: consumer %q: event %s: %w", m.opts.Consumer, id, err)
		}
		if !processed {
			m.log.Debug("txoutbox: duplicate event skipped", "event_id", id, "message_uuid", msg.UUID)
			if m.opts.OnDuplicate != nil {
				m.opts.OnDuplicate(orig, m.opts.Consumer, id)
			}
			return nil, nil
		}
		return produced, nil
	}
}
