#!/usr/bin/env node
'use strict'
// An MQTT.js subscriber for tests:
//
//   node tests/js/mqtt_sub.js URL FILTER[,FILTER...] COUNT
//        [--protocol-version 4|5] [--qos N] [--timeout SECONDS]
//
// URL is mqtt://127.0.0.1:PORT or ws://127.0.0.1:PORT/mqtt. Subscribes to every filter at
// --qos (default 0) with protocol version 5 unless told 4, prints `SUBSCRIBED` once the
// SUBACK grants them all (a barrier: publish only after reading it), then one JSON line per
// message, {"topic", "payload" (UTF-8 text), "retain", "qos"}, and exits 0 after COUNT of
// them (COUNT 0: right after SUBSCRIBED). A refused subscription or any error exits 1 with a
// message on stderr; the whole run is bounded by --timeout (30 s), then exit 124.

const { connect, disconnect, finish, parse } = require('./cli')

const USAGE = 'mqtt_sub.js URL FILTER[,FILTER...] COUNT [--protocol-version 4|5] [--qos N]'

function main () {
  const args = parse(USAGE, 3, {})
  if (args === null) return
  const [url, filterList, countText] = args.positionals
  const filters = filterList.split(',')
  const count = Number(countText)
  if (!Number.isInteger(count) || count < 0 || filters.includes('')) {
    finish(2, `COUNT must be a whole number >= 0 and no filter may be empty\nusage: ${USAGE}`)
    return
  }
  const client = connect(url, args.values)
  // MQTT.js may hand us a retained message before it runs the SUBACK callback: lines wait
  // here until SUBSCRIBED is out, so SUBSCRIBED is always the first line.
  const early = []
  let subscribed = false
  let received = 0
  const print = (line) => {
    process.stdout.write(`${JSON.stringify(line)}\n`)
    if (++received === count) disconnect(client)
  }
  client.on('message', (topic, payload, packet) => {
    if (received + early.length >= count) return // arrived while disconnecting: not ours
    const line = {
      topic,
      payload: payload.toString('utf8'),
      retain: Boolean(packet.retain),
      qos: packet.qos
    }
    if (subscribed) print(line)
    else early.push(line)
  })
  client.once('connect', () => {
    client.subscribe(filters, { qos: args.values.qos }, (err, granted) => {
      if (err) {
        const detail = (granted || []).map((g) => `${g.topic}: ${g.qos}`).join(', ')
        finish(1, `subscribe failed: ${err.message}${detail ? ` (${detail})` : ''}`)
        return
      }
      subscribed = true
      process.stdout.write('SUBSCRIBED\n')
      if (count === 0) disconnect(client)
      for (const line of early.splice(0)) print(line)
    })
  })
}

main()
