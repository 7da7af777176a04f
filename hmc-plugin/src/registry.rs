//! Transports chosen by name: a registry mapping a name (or `NAME://IP`) to a factory, with the built-in transports registered by the program and plugins by their own names.

use std::net::IpAddr;
use std::sync::Arc;

use hmc_core::{AnyCommunicator, Error, Result};

use crate::comm::PluginCommunicator;
use crate::load::{Discovery, PluginConfig};

/// What a factory is asked to open.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// The IP to listen on (port chosen by the system).
    pub bind: IpAddr,
    /// Further `key=value` settings, passed to plugins as configuration lines (built-in
    /// factories read the ones they know).
    pub settings: Vec<(String, String)>,
}

impl OpenOptions {
    /// Listen on `bind`, no further settings.
    pub fn new(bind: IpAddr) -> Self {
        OpenOptions {
            bind,
            settings: Vec::new(),
        }
    }

    /// Adds a `key=value` setting.
    pub fn with(mut self, key: &str, value: impl ToString) -> Self {
        self.settings.push((key.to_string(), value.to_string()));
        self
    }

    /// The configuration text a plugin's `comm_open` receives.
    pub fn config_text(&self) -> String {
        let mut s = format!("bind={}\n", self.bind);
        for (k, v) in &self.settings {
            s.push_str(&format!("{k}={v}\n"));
        }
        s
    }
}

/// Opens a transport.
pub type Factory = Arc<dyn Fn(&OpenOptions) -> Result<AnyCommunicator> + Send + Sync>;

struct Builtin {
    name: String,
    about: String,
    factory: Factory,
}

/// Transports by name: built-ins first, then plugins found on the search path (a folder's
/// plugin is loaded when its name is opened, [`Discovery`]).
pub struct TransportRegistry {
    builtins: Vec<Builtin>,
    discovery: parking_lot::Mutex<Discovery>,
    /// Where plugins come from, in the words of the program's own settings.
    search_hint: String,
}

/// The search hint of a command-line program.
const CLI_SEARCH_HINT: &str = "plugins are searched on HMC_PLUGIN_PATH and --plugin-path; \
                               list them with --list-transports";

impl TransportRegistry {
    /// A registry with the plugins `config` finds and no built-ins yet.
    pub fn discover(config: &PluginConfig) -> Self {
        TransportRegistry {
            builtins: Vec::new(),
            discovery: parking_lot::Mutex::new(Discovery::search(config)),
            search_hint: CLI_SEARCH_HINT.into(),
        }
    }

    /// A registry without plugins.
    pub fn without_plugins() -> Self {
        TransportRegistry {
            builtins: Vec::new(),
            discovery: parking_lot::Mutex::new(Discovery::default()),
            search_hint: CLI_SEARCH_HINT.into(),
        }
    }

    /// Registers a transport linked into the program. A plugin of the same name is then
    /// not reachable by that name (the report says so).
    pub fn register_builtin(
        &mut self,
        name: &str,
        about: &str,
        factory: impl Fn(&OpenOptions) -> Result<AnyCommunicator> + Send + Sync + 'static,
    ) -> &mut Self {
        self.builtins.push(Builtin {
            name: name.to_string(),
            about: about.to_string(),
            factory: Arc::new(factory),
        });
        self
    }

    /// Says where plugins come from in the program's own terms (a library's option, not
    /// a command-line flag), in the error for an unknown name.
    pub fn set_search_hint(&mut self, hint: &str) -> &mut Self {
        self.search_hint = hint.to_string();
        self
    }

    /// Every name that opens something, built-ins first.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.builtins.iter().map(|b| b.name.clone()).collect();
        let d = self.discovery.lock();
        let plugins = d
            .loaded
            .iter()
            .map(|p| p.name())
            .chain(d.unloaded.iter().map(|(n, _)| n.as_str()));
        for name in plugins {
            if !names.iter().any(|n| n == name) {
                names.push(name.to_string());
            }
        }
        names
    }

    /// What the plugin search found (and loaded since).
    pub fn discovery(&self) -> parking_lot::MutexGuard<'_, Discovery> {
        self.discovery.lock()
    }

    /// The plugin named `name`, loading it from its folder if need be.
    pub fn plugin(&self, name: &str) -> Option<std::sync::Arc<crate::Plugin>> {
        self.discovery.lock().load(name)
    }

    /// Opens the transport `spec` names: `NAME`, or `NAME://IP` to listen on that IP
    /// instead of `options.bind`.
    pub fn open(&self, spec: &str, options: &OpenOptions) -> Result<AnyCommunicator> {
        let (name, options) = match spec.split_once("://") {
            Some((name, host)) => {
                let bind = host.trim_end_matches('/').parse().map_err(|_| {
                    Error::InvalidArgument(format!(
                        "transport `{spec}`: `{host}` is not an IP address (use NAME or NAME://IP)"
                    ))
                })?;
                (
                    name,
                    OpenOptions {
                        bind,
                        ..options.clone()
                    },
                )
            }
            None => (spec, options.clone()),
        };
        if let Some(b) = self.builtins.iter().find(|b| b.name == name) {
            return (b.factory)(&options);
        }
        if let Some(p) = self.plugin(name) {
            let comm = PluginCommunicator::open(p, &options.config_text())?;
            return Ok(AnyCommunicator::new(comm));
        }
        let d = self.discovery.lock();
        let refused = match d.rejected.first() {
            None => String::new(),
            Some(first) => format!(
                "; {} plugin candidate(s) were refused, the first: {first}",
                d.rejected.len()
            ),
        };
        drop(d);
        Err(Error::InvalidArgument(format!(
            "no transport named `{name}`; known: {} ({}){refused}",
            self.names().join(", "),
            self.search_hint
        )))
    }

    /// A human-readable listing: built-ins, then the plugin search report.
    pub fn report(&self) -> String {
        let mut s = String::from("built-in transports:\n");
        for b in &self.builtins {
            s.push_str(&format!("  {:<12} {}\n", b.name, b.about));
        }
        let d = self.discovery.lock();
        for p in &d.loaded {
            if self.builtins.iter().any(|b| b.name == p.name()) {
                s.push_str(&format!(
                    "note: plugin `{}` ({}) is shadowed by the built-in of that name\n",
                    p.name(),
                    p.path().display()
                ));
            }
        }
        s.push_str(&d.report());
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_list_what_exists() {
        let mut r = TransportRegistry::without_plugins();
        r.register_builtin("none-such", "a test entry", |_| {
            Err(Error::Unsupported("test".into()))
        });
        let lo = OpenOptions::new([127, 0, 0, 1].into());
        let e = r.open("nope", &lo).unwrap_err().to_string();
        assert!(
            e.contains("no transport named `nope`") && e.contains("none-such"),
            "{e}"
        );
        assert!(
            e.contains("HMC_PLUGIN_PATH") && e.contains("--plugin-path"),
            "{e}"
        );
        r.set_search_hint("plugins come from the plugin_path option");
        let e = r.open("nope", &lo).unwrap_err().to_string();
        assert!(
            e.contains("(plugins come from the plugin_path option)"),
            "{e}"
        );
        let e = r
            .open("none-such://not-an-ip", &lo)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not an IP address"), "{e}");
        assert!(matches!(
            r.open("none-such://127.0.0.2", &lo),
            Err(Error::Unsupported(_))
        ));
    }

    #[test]
    fn plugin_configuration_carries_the_bind_address_and_settings() {
        let o = OpenOptions::new([10, 0, 0, 1].into()).with("max_pending_notifications", 0);
        assert_eq!(
            o.config_text(),
            "bind=10.0.0.1\nmax_pending_notifications=0\n"
        );
    }
}
