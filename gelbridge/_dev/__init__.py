"""Development helpers: a local reference PDS (``gelbridge._dev.pds``) and local stand-ins
for outside services, so gelbridge can be tried and tested without the network."""
