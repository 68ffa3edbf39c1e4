#!/usr/bin/env node
/*
 * Runs the npm OpAMP client (@elastic/opamp-client-node 0.5.0) against a server.
 *
 * Usage: NODE_PATH=DIR/node_modules node node_client.js --endpoint URL --out DIR
 *            [--service-name NAME] [--group G] [--token T] [--interval S]
 *            [--fail-config MSG]
 *
 * Install the client first in a directory of its own
 * (cd DIR && npm init -y && npm install @elastic/opamp-client-node@0.5.0).
 *
 * It connects as an OpenTelemetry SDK would: identifying attribute service.name,
 * non-identifying host.name and agent.group (the server's group), capabilities
 * AcceptsRemoteConfig and ReportsRemoteConfig. Each new remote configuration (by
 * config_hash) is written to DIR/config.json as
 * {"instance_uid", "config_hash" (hex), "files": {name: {"content_type", "body"}}}
 * and acknowledged APPLIED (or FAILED with --fail-config MSG). DIR/instance_uid
 * holds the client's uid (UUID text) from the start; DIR/events.jsonl one line per
 * send: {"event": "send_success"} or {"event": "send_fail", "error",
 * "retry_after_ms"} (the client's own reading of Retry-After / RetryInfo, floored at
 * 30 s), and {"event": "remote_config", ...}. SIGTERM or SIGINT stops it, exit 0.
 */

'use strict';

const fs = require('fs');
const os = require('os');
const path = require('path');
const diagnostics = require('diagnostics_channel');

const {
    createOpAMPClient,
    AgentCapabilities,
    RemoteConfigStatuses,
    DIAG_CH_SEND_SUCCESS,
    DIAG_CH_SEND_FAIL,
} = require('@elastic/opamp-client-node');

function parseArgs(argv) {
    const args = {
        serviceName: 'node-opamp-test',
        group: '',
        token: '',
        interval: 1,
        failConfig: '',
    };
    const names = {
        '--endpoint': 'endpoint',
        '--out': 'out',
        '--service-name': 'serviceName',
        '--group': 'group',
        '--token': 'token',
        '--interval': 'interval',
        '--fail-config': 'failConfig',
    };
    for (let i = 0; i < argv.length; i += 2) {
        const key = names[argv[i]];
        if (!key || i + 1 >= argv.length) {
            throw new Error(`unknown or incomplete argument ${argv[i]}`);
        }
        args[key] = key === 'interval' ? Number(argv[i + 1]) : argv[i + 1];
    }
    if (!args.endpoint || !args.out) {
        throw new Error('--endpoint URL and --out DIR are required');
    }
    return args;
}

function hex(bytes) {
    return Buffer.from(bytes).toString('hex');
}

function writeAtomic(file, text) {
    fs.writeFileSync(file + '.tmp', text);
    fs.renameSync(file + '.tmp', file);
}

function main() {
    let args;
    try {
        args = parseArgs(process.argv.slice(2));
    } catch (err) {
        process.stderr.write(`node_client.js: ${err.message}\n`);
        process.exit(2);
    }
    fs.mkdirSync(args.out, {recursive: true});
    const event = (name, fields) => {
        const line = JSON.stringify({event: name, time: Date.now() / 1000, ...fields});
        fs.appendFileSync(path.join(args.out, 'events.jsonl'), line + '\n');
    };

    const seen = new Set();
    let client;
    client = createOpAMPClient({
        endpoint: args.endpoint,
        headers: args.token ? {Authorization: `Bearer ${args.token}`} : {},
        capabilities:
            AgentCapabilities.AgentCapabilities_AcceptsRemoteConfig |
            AgentCapabilities.AgentCapabilities_ReportsRemoteConfig,
        heartbeatIntervalSeconds: args.interval,
        diagEnabled: true,
        onMessage: ({remoteConfig}) => {
            if (!remoteConfig) {
                return;
            }
            const configHash = hex(remoteConfig.configHash);
            if (seen.has(configHash)) {
                return;
            }
            seen.add(configHash);
            const files = {};
            const map = remoteConfig.config?.configMap ?? {};
            for (const name of Object.keys(map)) {
                files[name] = {
                    content_type: map[name].contentType,
                    body: Buffer.from(map[name].body).toString('utf8'),
                };
            }
            writeAtomic(
                path.join(args.out, 'config.json'),
                JSON.stringify(
                    {
                        instance_uid: uuidText(client.getInstanceUid()),
                        config_hash: configHash,
                        files,
                    },
                    null,
                    1
                )
            );
            const status = args.failConfig
                ? RemoteConfigStatuses.RemoteConfigStatuses_FAILED
                : RemoteConfigStatuses.RemoteConfigStatuses_APPLIED;
            client.setRemoteConfigStatus({
                status,
                lastRemoteConfigHash: remoteConfig.configHash,
                errorMessage: args.failConfig,
            });
            event('remote_config', {config_hash: configHash, status});
        },
    });

    diagnostics.subscribe(DIAG_CH_SEND_SUCCESS, () => event('send_success', {}));
    diagnostics.subscribe(DIAG_CH_SEND_FAIL, (msg) =>
        event('send_fail', {
            error: String(msg.err),
            retry_after_ms: msg.retryAfterMs ?? null,
        })
    );

    const nonIdentifying = {'host.name': os.hostname()};
    if (args.group) {
        nonIdentifying['agent.group'] = args.group;
    }
    client.setAgentDescription({
        identifyingAttributes: {'service.name': args.serviceName},
        nonIdentifyingAttributes: nonIdentifying,
    });
    writeAtomic(path.join(args.out, 'instance_uid'), uuidText(client.getInstanceUid()));
    client.start();
    event('started', {endpoint: args.endpoint});

    // The client's timers are unref'd: without this the process would just end.
    const keepAlive = setInterval(() => {}, 1 << 30);
    const stop = async () => {
        clearInterval(keepAlive);
        await client.shutdown();
        event('stopped', {});
        process.exit(0);
    };
    process.on('SIGTERM', stop);
    process.on('SIGINT', stop);
}

function uuidText(bytes) {
    const h = hex(bytes);
    return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

main();
