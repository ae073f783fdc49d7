package inbox

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
)

// cloudEventIDKeys are the metadata entries that hold a CloudEvent's id in
// binary content mode, as each protocol binding names them: ce-id (HTTP,
// NATS, and SNS as txoutbox sends it), ce_id (Kafka), cloudEvents:id and
// cloudEvents_id (AMQP).
var cloudEventIDKeys = []string{"ce-id", "ce_id", "cloudEvents:id", "cloudEvents_id", "Ce-Id"}

// cloudEventID returns the id of the CloudEvent msg carries, or "": from
// the binary mode's metadata, else from a structured-mode body (the JSON
// event format, recognised by its specversion), so that CloudEvents from
// producers other than txoutbox's relay are deduplicated too.
func cloudEventID(msg *message.Message) string {
	for _, k := range cloudEventIDKeys {
		if id := strings.TrimSpace(msg.Metadata.Get(k)); id != "" {
			return id
		}
	}
	body := bytes.TrimSpace(msg.Payload)
	if len(body) == 0 || body[0] != '{' || !bytes.Contains(body, []byte(`"specversion"`)) {
		return ""
	}
	var ce struct {
		SpecVersion string `json:"specversion"`
		ID          string `json:"id"`
	}
	if json.Unmarshal(body, &ce) != nil || ce.SpecVersion == "" {
		return ""
	}
	return strings.TrimSpace(ce.ID)
}
