#!/usr/bin/env node
'use strict'
// An MQTT.js publisher for tests:
//
//   node tests/js/mqtt_pub.js URL TOPIC PAYLOAD
//        [--qos N] [--retain] [--protocol-version 4|5] [--timeout SECONDS]
//
// Publishes PAYLOAD (as UTF-8) once and exits 0 when it is done: for QoS 1 after the
// PUBACK, for QoS 2 after the PUBCOMP, for QoS 0 once the packet is written to the
// connection; then disconnects cleanly. A negative acknowledgement (MQTT 5 reason code
// >= 0x80) or any error exits 1 with a message on stderr; the run is bounded by --timeout
// (30 s), then exit 124.

const { connect, disconnect, finish, parse } = require('./cli')

const USAGE =
  'mqtt_pub.js URL TOPIC PAYLOAD [--qos N] [--retain] [--protocol-version 4|5]'

function main () {
  const args = parse(USAGE, 3, { retain: { type: 'boolean', default: false } })
  if (args === null) return
  const [url, topic, payload] = args.positionals
  const client = connect(url, args.values)
  client.once('connect', () => {
    const options = { qos: args.values.qos, retain: args.values.retain }
    client.publish(topic, payload, options, (err) => {
      if (err) {
        finish(1, `publish failed: ${err.message}`)
        return
      }
      disconnect(client)
    })
  })
}

main()
