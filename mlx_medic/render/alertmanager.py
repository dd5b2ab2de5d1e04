"""The Alertmanager config: the alerts the remediator acts on reach its webhook (with
`send_resolved` and a `credentials_file`), and every alert reaches on-call.

No inhibition mutes an alert the remediator acts on: an inhibited alert is muted for every
receiver, webhook included. The orphan alert counts only orphans a sweep can remove (not
those in uninterruptible wait, which have their own page), so a stuck rank on a node
never hides the fresh orphans beside it that need sweeping.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from mlx_medic.render.files import ONCALL_PLACEHOLDER, Rendered, Site, check_duration
from mlx_medic.render.yaml_files import dump

TARGET = "alertmanager"
FILE = PurePosixPath("alertmanager.yml")
# What the remediator's webhook receives, and the labels that name what to act on.
REMEDIATOR_ALERTS = {
    "LLMModelDown": ["alertname", "model"],
    "MLXOrphanProcesses": ["alertname", "model", "node"],
}
# Routed only when a node opts in to the guarded reboot (`reboot.allowed`): its run is per
# node (docs/drain.md); without one, the alert reaches on-call alone, as before.
REBOOT_ALERTS = {"MLXUnkillableSurvivors": ["alertname", "node"]}


def remediator_alerts(site: Site) -> dict[str, list[str]]:
    """The alerts routed to the remediator's webhook for this inventory."""
    rebooting = any(node.reboot.allowed for node in site.inventory.nodes)
    return {**REMEDIATOR_ALERTS, **(REBOOT_ALERTS if rebooting else {})}


def render(site: Site) -> list[Rendered]:
    url = site.need(site.remediator_url, "--remediator.url").rstrip("/")
    wait, interval = site.alertmanager_group_wait, site.alertmanager_group_interval
    if wait is not None:
        check_duration(wait, "--alertmanager.group-wait")
    if interval is not None:
        check_duration(interval, "--alertmanager.group-interval")
    routes: list[dict[str, object]] = [
        {
            "receiver": "mlx-medic",
            "matchers": [f'alertname="{name}"'],
            "group_by": group_by,
            "group_wait": wait or "10s",
            "group_interval": interval or "1m",
            "repeat_interval": "30m",
            "continue": True,
        }
        for name, group_by in remediator_alerts(site).items()
    ]
    routes.append({"receiver": "oncall"})
    data = {
        "route": {
            "receiver": "oncall",
            "group_by": ["alertname", "node", "model"],
            "group_wait": wait or "30s",
            "group_interval": interval or "5m",
            "repeat_interval": "4h",
            "routes": routes,
        },
        "receivers": [
            {
                "name": "mlx-medic",
                "webhook_configs": [
                    {
                        "url": f"{url}/alerts",
                        "send_resolved": True,
                        "max_alerts": 0,
                        "http_config": {
                            "authorization": {
                                "type": "Bearer",
                                "credentials_file": site.alertmanager_credentials_file,
                            }
                        },
                    }
                ],
            },
            {
                "name": "oncall",
                "webhook_configs": [{"url": site.oncall_url, "send_resolved": True}],
            },
        ],
        "inhibit_rules": [
            {
                "source_matchers": ['alertname="MLXRDMAProtectionDomainsExhausted"'],
                "target_matchers": ['alertname="MLXRDMAProtectionDomainsHigh"'],
                "equal": ["node"],
            },
        ],
    }
    oncall = (
        "The oncall receiver is a placeholder: your pager."
        if site.oncall_url == ONCALL_PLACEHOLDER
        else f"On-call: {site.oncall_url}."
    )
    comment = (
        "Check with: amtool check-config alertmanager.yml\n"
        f"{', '.join(remediator_alerts(site))} reach the remediator (it answers at once and\n"
        "ignores repeats of a firing while its run is queued or running, or after it\n"
        "succeeded; it acts on the alerts its routing.playbooks names and journals the\n"
        "others) and, through `continue`, on-call. The token is the one the remediator reads\n"
        "from auth.bearer_token_file. " + oncall + "\n"
        "Inhibition: an exhausted protection-domain pool mutes the 'high' warning for its\n"
        "node. Nothing mutes an alert the remediator acts on (muting is for every receiver)."
    )
    return [Rendered(FILE, dump(data, comment))]
