"""Record URIs the sealing tests seal for: ``URI``, and ``OTHER``, another record."""

URI = "at://did:plc:abc123/chat.gel.assistant.message/3mabcdefghij2"
OTHER = "at://did:plc:abc123/chat.gel.assistant.message/3mabcdefghik2"
