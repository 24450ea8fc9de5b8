"""A deterministic, synthetic industrial-service knowledge base (power-plant turbines, compressors, valves...).

Problem *archetypes* are built combinatorially: subsystem × component × failure mode (210 of them), each with
three root causes (630 problem classes). A ticket is a noisy paraphrase of one class in the formal "ticket"
register (SUB ≈ 5 words, DESC ≈ 65, SOL ≈ 75); a query describes a class the way a field engineer types it:
another register (synonyms, abbreviations such as GT, ST, HRSG, IGV), typos, reordered sentences, masked
numbers `##` and names `XXXX`. Shared boilerplate and distractor sentences that name other subsystems keep word
overlap from solving the task. Labels: same archetype and cause → 5 (YES), same subsystem → 3 (REL), else 1 (NO).

Used for the demo and the tests, never as the only evidence of quality.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from ..files import atomic_file
from .records import NO, REL, YES, LabeledPair, Query, Ticket
from .store import Dataset

#: A concept's surface forms: (ticket register, query register).
Term = tuple[tuple[str, ...], tuple[str, ...]]

#: Chance that a text borrows a word form from the *other* register (the lexical overlap BM25 can exploit).
DEFAULT_OVERLAP = 0.18
#: Per-word chance of a typo in a query.
TYPO_RATE = 0.04
#: Most YES / REL / NO pairs labelled per query.
MAX_YES, N_REL, N_NO = 5, 3, 3


# -- the world: subsystems, components, failure modes, causes -------------------------------------------------
SUBSYSTEMS: dict[str, tuple[Term, list[Term], list[str]]] = {
    # key: (name forms, components, failure modes)
    "gas_turbine": ((("gas turbine",), ("GT", "gas turb", "combustion turbine")), [
        (("compressor blading", "axial compressor blades"), ("comp blades", "compressor airfoils")),
        (("inlet guide vanes",), ("IGV", "IGVs", "guide vanes")),
        (("turbine rotor", "hot gas path rotor"), ("rotor", "HGP rotor")),
    ], ["vibration", "overheating", "trip", "efficiency_loss", "contamination"]),
    "steam_turbine": ((("steam turbine",), ("ST", "steam turb")), [
        (("governor valve",), ("GV", "throttle valve")),
        (("gland seal",), ("gland", "shaft packing")),
        (("low pressure rotor",), ("LP rotor", "LP section")),
    ], ["vibration", "leakage", "sticking", "trip", "corrosion"]),
    "compressor": ((("process compressor", "centrifugal compressor"), ("comp", "compr", "gas booster")), [
        (("impeller",), ("wheel", "rotor wheel")),
        (("dry gas seal",), ("DGS", "gas seal")),
        (("anti-surge valve",), ("ASV", "surge valve", "recycle valve")),
    ], ["vibration", "leakage", "noise", "efficiency_loss", "trip"]),
    "generator": ((("generator",), ("gen", "alternator", "genset")), [
        (("stator winding",), ("stator", "windings")),
        (("excitation system",), ("exciter", "AVR")),
        (("hydrogen cooler",), ("H2 cooler", "gas cooler")),
    ], ["overheating", "sensor_fault", "trip", "contamination", "noise"]),
    "lube_oil": ((("lube oil system", "lubrication system"), ("LO system", "oil system", "lube skid")), [
        (("main oil pump",), ("MOP", "lube pump")),
        (("oil cooler",), ("LO cooler", "oil HX")),
        (("duplex filter",), ("oil filter", "filter element")),
    ], ["pressure_low", "overheating", "leakage", "contamination", "noise"]),
    "fuel_gas": ((("fuel gas system",), ("FG system", "fuel skid", "gas fuel supply")), [
        (("gas control valve",), ("GCV", "fuel valve")),
        (("fuel nozzle",), ("injector", "nozzle tip")),
        (("fuel gas scrubber",), ("knockout drum", "separator")),
    ], ["pressure_low", "leakage", "sticking", "contamination", "start_failure"]),
    "combustion": ((("combustion system",), ("burner section", "combustor", "DLN")), [
        (("combustion liner",), ("liner", "can")),
        (("igniter",), ("spark plug", "ignitor")),
        (("flame detector",), ("flame scanner", "UV scanner")),
    ], ["overheating", "start_failure", "noise", "sensor_fault", "corrosion"]),
    "bearings": ((("bearing assembly",), ("brg", "bearing pedestal")), [
        (("thrust bearing",), ("thrust brg", "axial brg")),
        (("journal bearing",), ("radial brg", "JB")),
        (("bearing housing",), ("housing", "pedestal")),
    ], ["vibration", "overheating", "noise", "corrosion", "contamination"]),
    "control": ((("control system", "turbine controller"), ("DCS", "controls", "PLC")), [
        (("speed sensor",), ("speed pickup", "MPU")),
        (("input output card",), ("IO module", "IO card")),
        (("servo valve",), ("servo", "EHC servo")),
    ], ["sensor_fault", "trip", "start_failure", "sticking", "overheating"]),
    "cooling_water": ((("cooling water system",), ("CW system", "closed cooling loop", "cooling circuit")), [
        (("circulating pump",), ("CW pump", "circ pump")),
        (("plate heat exchanger",), ("PHE", "plate cooler")),
        (("cooling tower fan",), ("CT fan", "tower fan")),
    ], ["pressure_low", "leakage", "corrosion", "contamination", "efficiency_loss"]),
    "hrsg": ((("heat recovery steam generator",), ("HRSG", "waste heat boiler")), [
        (("superheater tubes",), ("SH tubes", "superheater")),
        (("drum level transmitter",), ("drum LT", "level transmitter")),
        (("economizer",), ("eco", "ECO section")),
    ], ["leakage", "corrosion", "sensor_fault", "efficiency_loss", "overheating"]),
    "valves": ((("valve assembly",), ("CV", "valve")), [
        (("valve stem",), ("stem", "spindle")),
        (("actuator diaphragm",), ("diaphragm", "actuator")),
        (("valve positioner",), ("IP positioner", "smart positioner")),
    ], ["sticking", "leakage", "noise", "sensor_fault", "corrosion"]),
    "inlet_air": ((("air inlet system", "inlet filter house"), ("intake", "filter house", "air intake")), [
        (("filter cartridges",), ("filters", "pulse filters")),
        (("anti-icing system",), ("anti icing", "heating coil")),
        (("inlet silencer",), ("silencer", "baffles")),
    ], ["pressure_low", "contamination", "efficiency_loss", "noise", "corrosion"]),
    "exhaust": ((("exhaust system",), ("exhaust stack", "exh duct", "outlet duct")), [
        (("expansion joint",), ("bellows", "exp joint")),
        (("exhaust thermocouples",), ("TCs", "exhaust temps")),
        (("diverter damper",), ("damper", "bypass damper")),
    ], ["leakage", "overheating", "sensor_fault", "noise", "corrosion"]),
}

#: failure mode: (name forms, ticket symptom sentences, query symptom sentences, its three causes)
MODES: dict[str, tuple[Term, tuple[str, ...], tuple[str, ...], tuple[str, str, str]]] = {
    "vibration": ((("high vibration", "excessive vibration", "vibration alarm"), ("shaking", "vib", "oscillation")),
                  ("Vibration amplitude on the {comp} exceeded the alarm limit of ## mm/s.",
                   "The condition monitoring system recorded increasing vibration at the {comp}."),
                  ("{comp} shaking a lot, readings jump to ## on the panel.",
                   "we feel strong vib near the {comp} when load goes up"),
                  ("misalignment", "bearing_wear", "imbalance")),
    "overheating": ((("high temperature", "overheating", "temperature excursion"), ("running hot", "temp high", "too hot")),
                    ("Temperature at the {comp} rose above the trip setpoint of ## degC.",
                     "A high temperature alarm was raised for the {comp} during base load."),
                    ("{comp} running hot, about ## deg on the screen.",
                     "temp keeps climbing at the {comp} and the alarm came on"),
                    ("cooling_blockage", "lube_degradation", "overload")),
    "leakage": ((("leakage", "leak", "fluid loss"), ("dripping", "seeping", "weeping")),
                ("A leakage was found at the {comp} during the walkdown inspection.",
                 "Fluid loss of approximately ## litres per shift was measured at the {comp}."),
                ("something is dripping from the {comp}, puddle on the floor",
                 "{comp} weeping again, we top up ## l every day"),
                ("seal_wear", "gasket_failure", "loose_fitting")),
    "trip": ((("unit trip", "unexpected trip", "protective shutdown"), ("tripped", "went offline", "dropped out")),
             ("The unit tripped on protection signal from the {comp} at ## MW.",
              "An unexpected shutdown was initiated by the {comp} protection logic."),
             ("machine went offline suddenly, first out was the {comp}",
              "we dropped out at ## MW, alarm list points to {comp}"),
             ("protection_setting", "sensor_drift", "power_supply_fault")),
    "pressure_low": ((("low pressure", "pressure drop", "pressure loss"), ("press low", "pressure falling", "weak pressure")),
                     ("Pressure downstream of the {comp} dropped below ## bar.",
                      "A low pressure alarm was generated for the {comp} header."),
                     ("press low after the {comp}, gauge shows only ## bar",
                      "pressure keeps falling at the {comp} and we get alarms"),
                     ("filter_clogging", "pump_wear", "seal_wear")),
    "noise": ((("abnormal noise", "unusual sound", "knocking noise"), ("strange sound", "rattling", "banging")),
              ("An abnormal noise was reported from the {comp} during operation.",
               "Operators heard a knocking noise at the {comp} above ## percent load."),
              ("strange sound from the {comp}, like rattling metal",
               "loud banging near {comp} when we ramp up"),
              ("bearing_wear", "looseness", "cavitation")),
    "sticking": ((("sticking", "stuck", "seized"), ("jammed", "not moving", "frozen")),
                 ("The {comp} was found sticking and did not follow the demand signal.",
                  "Position feedback of the {comp} deviated by ## percent from the setpoint."),
                 ("{comp} jammed, demand changes but nothing moves",
                  "the {comp} is frozen at ## percent and will not follow"),
                 ("deposit_buildup", "actuator_failure", "lube_degradation")),
    "start_failure": ((("failure to start", "start failure", "start-up failure"), ("won't start", "no start", "aborted start")),
                      ("The start sequence was aborted at the {comp} step after ## seconds.",
                       "The unit failed to start because the {comp} permissive was not reached."),
                      ("unit won't start, sequence hangs at the {comp}",
                       "aborted start again, stuck at {comp} step for ## sec"),
                      ("ignition_fault", "power_supply_fault", "software_config")),
    "sensor_fault": ((("signal fault", "erratic reading", "sensor failure"), ("bad signal", "jumping values", "flickering reading")),
                     ("The {comp} signal showed erratic readings between ## and ## units.",
                      "A signal quality fault was raised for the {comp} channel."),
                     ("bad signal from {comp}, value flickering on the HMI",
                      "{comp} values jumping around, sometimes ## sometimes zero"),
                     ("wiring_damage", "sensor_drift", "emi_interference")),
    "efficiency_loss": ((("performance degradation", "efficiency loss", "output reduction"), ("less power", "poor output", "derate")),
                        ("Performance test showed an efficiency loss of ## percent attributed to the {comp}.",
                         "Output reduction of ## MW was observed with the {comp} in service."),
                        ("we get less power than before, suspect the {comp}",
                         "poor output, lost ## MW since the {comp} work"),
                        ("deposit_buildup", "erosion", "air_leak")),
    "corrosion": ((("corrosion", "pitting", "material degradation"), ("rust", "rusting", "eaten away")),
                  ("Inspection revealed corrosion on the {comp} surfaces.",
                   "Pitting with a depth of ## mm was measured on the {comp}."),
                  ("lots of rust on the {comp}, looks eaten away",
                   "{comp} rusting badly, holes of ## mm"),
                  ("water_ingress", "chemistry_imbalance", "coating_failure")),
    "contamination": ((("contamination", "fouling", "deposits"), ("dirty", "gunk", "buildup")),
                      ("Contamination was detected in the {comp} during the routine sample.",
                       "Deposits were found on the {comp} at the last inspection."),
                      ("{comp} very dirty, full of gunk",
                       "buildup inside the {comp}, sample looks bad"),
                      ("filter_clogging", "water_ingress", "foreign_object")),
}

#: cause: (ticket evidence sentences, query evidence sentences, root cause phrases, solution action sentences)
CAUSES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "misalignment": (("Coupling alignment check showed an offset of ## mm.", "The spectrum was dominated by the twice running speed component."),
                     ("shaft does not look lined up after the coupling job", "2x peak is the big one in the vib spectrum"),
                     ("shaft misalignment", "coupling misalignment"),
                     ("Realigned the coupling with a laser alignment tool to within ## mm.", "Checked soft foot and corrected shims under the feet.")),
    "bearing_wear": (("Bearing metal temperature increased by ## degC over two weeks.", "Oil analysis showed babbitt particles."),
                     ("found shiny flakes in the oil sample", "brg temp creeping up day by day"),
                     ("worn bearing pads", "bearing wear"),
                     ("Replaced the bearing pads and checked the clearance to ## mm.", "Flushed the oil lines to remove wear debris.")),
    "imbalance": (("The once per revolution component dominated the vibration spectrum.", "Vibration phase angle shifted by ## degrees."),
                  ("1x is the highest peak", "phase moved a lot compared to last week"),
                  ("rotor imbalance", "mass imbalance"),
                  ("Performed a trim balance with ## g correction weight.", "Cleaned deposits from the rotor before balancing.")),
    "cooling_blockage": (("Cooling water flow was ## percent below design.", "Differential temperature across the cooler was low."),
                         ("cooler outlet barely colder than inlet", "not enough water going through the cooler"),
                         ("blocked cooling passages", "fouled cooler"),
                         ("Cleaned the cooler tubes and back flushed the cooling circuit.", "Replaced the strainer basket upstream of the cooler.")),
    "lube_degradation": (("Oil sample showed oxidation and a viscosity change of ## percent.", "The lubricant acid number exceeded the limit."),
                         ("oil looks dark and smells burnt", "lab says the oil is old and acidic"),
                         ("degraded lubricant", "oxidised oil"),
                         ("Drained and replaced the lubricant charge.", "Installed a varnish removal unit on the oil circuit.")),
    "overload": (("The unit had been operated at ## percent above rated load.", "Load current exceeded the nameplate rating."),
                 ("we ran above nameplate for days", "load was pushed higher than allowed"),
                 ("operation beyond rated capacity", "overloading"),
                 ("Limited the load setpoint to the rated value in the controller.", "Briefed operations on the load limits.")),
    "seal_wear": (("Seal faces showed wear grooves of ## mm.", "Seal leakage flow increased steadily."),
                  ("seal is finished, grooves on the face", "leak-off flow higher every week"),
                  ("worn seal", "seal degradation"),
                  ("Replaced the seal cartridge and verified the leak-off flow.", "Adjusted the seal gas supply pressure to ## bar.")),
    "gasket_failure": (("The flange gasket was found blown out.", "Bolt torque on the flange was below specification."),
                       ("gasket pushed out of the flange", "flange bolts feel loose"),
                       ("failed flange gasket", "gasket failure"),
                       ("Installed a new spiral wound gasket.", "Torqued the flange bolts to ## Nm in a cross pattern.")),
    "loose_fitting": (("A compression fitting on the instrument line was loose.", "Thread damage was found on the connection."),
                      ("small pipe connection not tight", "fitting can be turned by hand"),
                      ("loose fitting", "improper connection"),
                      ("Re-made the connection with a new ferrule.", "Checked all fittings on the skid for tightness.")),
    "protection_setting": (("The trip setpoint was configured at ## instead of the design value.", "Recent logic change reduced the protection margin."),
                           ("limit in the logic looks too tight", "someone changed the trip value recently"),
                           ("incorrect protection setting", "wrong trip setpoint"),
                           ("Corrected the protection setpoint per the design document.", "Reviewed the change log with the controls engineer.")),
    "sensor_drift": (("Redundant transmitters disagreed by ## percent.", "Calibration check showed the transmitter had drifted."),
                     ("two sensors show different numbers", "value slowly wandering even when steady"),
                     ("transmitter drift", "sensor calibration drift"),
                     ("Recalibrated the transmitter against a reference standard.", "Replaced the sensor element and updated the calibration record.")),
    "power_supply_fault": (("The ## V DC supply voltage dipped during the event.", "A power supply module showed a fault light."),
                           ("battery charger alarm came at the same time", "24 V looks low on the meter"),
                           ("power supply failure", "supply voltage dip"),
                           ("Replaced the faulty power supply module.", "Checked the battery bank and the charger output.")),
    "filter_clogging": (("Filter differential pressure reached ## mbar.", "The filter element was found heavily loaded."),
                        ("dp across filter very high", "filter is full of dirt"),
                        ("clogged filter", "blocked filter element"),
                        ("Changed over to the standby filter and replaced the elements.", "Shortened the filter replacement interval.")),
    "pump_wear": (("Pump discharge head was ## percent below its curve.", "Wear ring clearance was above limit."),
                  ("pump sounds tired and does not build head", "pump performance down"),
                  ("worn pump internals", "pump wear"),
                  ("Overhauled the pump and replaced the wear rings.", "Verified pump performance against the curve.")),
    "looseness": (("Several foundation bolts were found loose.", "Harmonics of running speed appeared in the spectrum."),
                  ("bolts on the base plate loose", "lots of harmonics in the spectrum"),
                  ("mechanical looseness", "loose foundation bolts"),
                  ("Retorqued the foundation bolts to ## Nm.", "Repaired the grout under the baseplate.")),
    "cavitation": (("Suction pressure was close to the vapour pressure.", "Pitting was seen on the impeller inlet."),
                   ("sounds like gravel inside", "suction side pressure very low"),
                   ("cavitation", "insufficient suction head"),
                   ("Raised the suction tank level to restore the margin.", "Cleaned the suction strainer.")),
    "deposit_buildup": (("Deposits of ## mm thickness were removed from the internals.", "Hard scale was found on the moving parts."),
                        ("crusty layer on the parts", "scale everywhere inside"),
                        ("deposit buildup", "scaling"),
                        ("Cleaned the internals with a chemical wash.", "Installed an online washing routine.")),
    "actuator_failure": (("The actuator did not respond to the ## percent step test.", "Hydraulic pressure at the actuator was low."),
                         ("actuator does nothing on stroke test", "hydraulics look weak"),
                         ("actuator malfunction", "failed actuator"),
                         ("Replaced the actuator and performed a full stroke test.", "Bled air from the hydraulic lines.")),
    "ignition_fault": (("No spark was detected at the ignition transformer.", "Igniter tip was eroded."),
                       ("no spark when we try", "ignitor tip burned off"),
                       ("ignition system fault", "igniter failure"),
                       ("Replaced the igniter and the ignition cable.", "Tested the ignition transformer output.")),
    "software_config": (("A parameter in the start sequence was changed in the last update.", "Controller firmware version ## was loaded."),
                        ("after the software update this started", "sequence settings changed by vendor"),
                        ("configuration error", "software parameter error"),
                        ("Restored the sequence parameters from the backup.", "Documented the configuration in the change management system.")),
    "wiring_damage": (("Insulation resistance of the cable was ## MOhm.", "A damaged cable was found near the junction box."),
                      ("cable looks chewed near the JB", "megger shows low value"),
                      ("damaged wiring", "cable insulation failure"),
                      ("Replaced the damaged cable section.", "Re-terminated the connections in the junction box.")),
    "emi_interference": (("Noise on the signal coincided with switching of a nearby drive.", "The cable shield was grounded at both ends."),
                         ("goes crazy when the VFD starts", "shield connected on both sides"),
                         ("electromagnetic interference", "signal noise from EMI"),
                         ("Grounded the cable shield at one end only.", "Rerouted the signal cable away from power cables.")),
    "erosion": (("Leading edges showed material loss of ## mm.", "Erosion marks were found during the borescope inspection."),
                ("edges worn down on the borescope pics", "material missing at the tips"),
                ("erosion", "particle erosion"),
                ("Replaced the eroded parts.", "Improved the upstream filtration.")),
    "air_leak": (("Smoke test revealed air ingress at the casing joint.", "Oxygen content downstream was ## percent higher."),
                 ("air getting in somewhere", "O2 reading too high"),
                 ("air in-leakage", "casing leak"),
                 ("Sealed the casing joint with new packing.", "Repaired the inspection door seals.")),
    "water_ingress": (("Water content in the sample was ## ppm.", "Condensate was found inside the enclosure."),
                      ("water inside where it should be dry", "sample cloudy with water"),
                      ("water ingress", "moisture intrusion"),
                      ("Repaired the enclosure seals and installed a dehumidifier.", "Drained the water and dried the system.")),
    "chemistry_imbalance": (("Water chemistry showed a pH of ##.", "Dissolved oxygen exceeded the limit."),
                            ("pH is off from the lab sheet", "too much oxygen in the water"),
                            ("water chemistry deviation", "improper chemical dosing"),
                            ("Adjusted the chemical dosing to restore the pH.", "Retrained the chemistry technicians on sampling.")),
    "coating_failure": (("Protective coating was found flaking.", "Coating thickness was below ## micron."),
                        ("paint peeling off", "coating gone in spots"),
                        ("coating breakdown", "failed protective coating"),
                        ("Blasted and recoated the surfaces.", "Added the coating to the inspection plan.")),
    "foreign_object": (("A foreign object was recovered from the {comp}.", "Debris of ## mm was found in the strainer."),
                       ("found a piece of metal inside", "some debris left from the outage"),
                       ("foreign object debris", "foreign material"),
                       ("Removed the debris and inspected for damage.", "Reinforced the foreign material exclusion procedure.")),
}

_TICKET_OPENERS = (
    "During normal operation at site XXXX the unit was running at ## MW.",
    "Customer XXXX reported an issue on unit ## during the morning shift.",
    "The event occurred on unit ## after the planned outage in week ##.",
    "Site engineer XXXX opened this case after the last inspection round.",
    "The plant was operating in combined cycle mode at ## percent load.",
)
_TICKET_CLOSERS = (
    "Please advise on the root cause and the corrective action.",
    "Customer requests support to restore normal operation.",
    "Trend data and alarm logs are attached to this case.",
    "Further support from engineering is requested.",
)
_DISTRACTORS = (
    "Lube oil temperature and pressure were within normal limits.",
    "The inlet filter differential pressure was checked and found normal.",
    "Exhaust temperature spread was within the allowed band.",
    "Generator output and power factor were stable.",
    "No abnormality was found on the fuel gas supply.",
    "The control system showed no other active alarms.",
    "Cooling water flow and temperature were normal.",
    "Bearing vibration on the other units was normal.",
    "The last borescope inspection showed no findings.",
    "Ambient temperature was ## degC at the time.",
)
_SOL_CLOSERS = (
    "The unit was returned to service and monitored for ## hours without further alarms.",
    "After the work the unit was restarted and all readings were normal.",
    "Operation was confirmed stable during the following ## days.",
)
_SOL_WORK = (
    "The work was carried out under permit ## by the service team of XXXX.",
    "Field service engineer XXXX performed the job during a ## hour outage.",
    "All work steps and measurements were recorded in the maintenance system.",
)
_SOL_ADVICE = (
    "Recommend including this check in the next scheduled maintenance of the {sub}.",
    "A lessons learned note was shared with the fleet of similar {sub} units.",
    "Spare parts stock for the {sub} was reviewed with the customer.",
)
_VERIFY = (
    "After the repair the {mode} on the {comp} was no longer present.",
    "Readings at the {comp} returned to normal values of ##.",
)
_QUERY_OPENERS = ("Hi team,", "Hello,", "Site XXXX here.", "Urgent request from XXXX.", "Good morning,")
_QUERY_CLOSERS = ("pls help asap, what should we check?", "any idea what causes this?",
                  "need advice urgently.", "what to do next?", "thanks in advance.")
_QUERY_DISTRACTORS = ("oil temps look ok.", "other units are fine.", "no alarms on the fuel side.",
                      "filters changed last month.", "load was ## MW at the time.", "weather was cold.")


@dataclass(frozen=True)
class ProblemClass:
    """One (archetype, cause): the unit of "same problem, same solution"."""

    subsystem: str
    component: int
    mode: str
    cause: str

    @property
    def archetype(self) -> str:
        return f"{self.subsystem}/{self.component}/{self.mode}"


def problem_classes() -> list[ProblemClass]:
    """All 630 problem classes (210 archetypes × 3 causes), in a fixed order."""
    return [ProblemClass(sub, c, mode, cause)
            for sub, (_, comps, modes) in SUBSYSTEMS.items()
            for c in range(len(comps))
            for mode in modes
            for cause in MODES[mode][3]]


class _Writer:
    """Draws surface forms for one register ("ticket" or "query") with some leakage into the other."""

    def __init__(self, rng: random.Random, register: int, overlap: float):
        self.rng, self.register, self.overlap = rng, register, overlap

    def form(self, term: Term) -> str:
        side = self.register if self.rng.random() >= self.overlap else 1 - self.register
        return self.rng.choice(term[side])


def _capital(sentence: str) -> str:
    return sentence[:1].upper() + sentence[1:]


def _ticket(rng: random.Random, writer: _Writer, cls: ProblemClass, ticket_id: str) -> Ticket:
    sub_term, comps, _ = SUBSYSTEMS[cls.subsystem]
    comp_term = comps[cls.component]
    mode_term, mode_t, _, _ = MODES[cls.mode]
    evidence_t, _, roots, actions = CAUSES[cls.cause]
    sub, comp, mode = writer.form(sub_term), writer.form(comp_term), writer.form(mode_term)
    subject = rng.choice((f"{sub} {comp} {mode}", f"{comp} {mode}", f"{mode} on {comp}", f"{sub} {mode}"))
    symptoms = rng.sample(mode_t, len(mode_t))
    evidence = rng.sample(evidence_t, len(evidence_t))
    desc = [rng.choice(_TICKET_OPENERS), symptoms[0].format(comp=f"{comp} of the {sub}")]
    middle = evidence + [symptoms[1].format(comp=comp)] + rng.sample(_DISTRACTORS, 1)
    rng.shuffle(middle)
    desc += middle + ([rng.choice(_TICKET_CLOSERS)] if rng.random() < 0.6 else [])
    steps = list(actions)
    rng.shuffle(steps)
    sol = [f"Root cause was identified as {rng.choice(roots)} at the {comp}.",
           *(s.format(comp=comp) for s in steps),
           rng.choice(_VERIFY).format(mode=writer.form(mode_term), comp=comp),
           rng.choice(_SOL_WORK), rng.choice(_SOL_CLOSERS), rng.choice(_SOL_ADVICE).format(sub=writer.form(sub_term))]
    metadata = {"subsystem": cls.subsystem, "archetype": cls.archetype, "cause": cls.cause}
    return Ticket(ticket_id, _capital(subject), " ".join(_capital(s.format(comp=comp)) for s in desc),
                  " ".join(_capital(s) for s in sol), metadata)


def _typos(rng: random.Random, text: str, rate: float) -> str:
    words = text.split(" ")
    for i, w in enumerate(words):
        if len(w) > 3 and w.isalpha() and rng.random() < rate:
            j = rng.randrange(1, len(w) - 1)
            op = rng.randrange(3)
            if op == 0:
                w = w[:j] + w[j + 1] + w[j] + w[j + 2:]
            elif op == 1:
                w = w[:j] + w[j + 1:]
            else:
                w = w[:j] + w[j] + w[j:]
            words[i] = w
    return " ".join(words)


def _query(rng: random.Random, writer: _Writer, cls: ProblemClass, query_id: str) -> Query:
    sub_term, comps, _ = SUBSYSTEMS[cls.subsystem]
    comp_term = comps[cls.component]
    mode_term, _, mode_q, _ = MODES[cls.mode]
    _, evidence_q, _, _ = CAUSES[cls.cause]
    sub, comp, mode = writer.form(sub_term), writer.form(comp_term), writer.form(mode_term)
    subject = rng.choice((f"{sub} {comp} {mode}", f"{mode} {comp}", f"{comp} {mode} again", f"{mode} at {sub}"))
    body = [s.format(comp=f"{writer.form(comp_term)}") for s in mode_q]
    body += rng.sample(evidence_q, rng.choice((1, 2, 2)))
    body += [f"this is on the {writer.form(sub_term)} of unit ##."] + rng.sample(_QUERY_DISTRACTORS, 2)
    rng.shuffle(body)
    body = [s + "." if s[-1] not in ".?!" and rng.random() < 0.7 else s for s in body]
    text = " ".join([rng.choice(_QUERY_OPENERS)] + [_capital(s) if rng.random() < 0.5 else s for s in body]
                    + [rng.choice(_QUERY_CLOSERS)])
    return Query(_typos(rng, subject, TYPO_RATE), _typos(rng, text, TYPO_RATE), query_id)


def generate(n_tickets: int, n_queries: int, seed: int = 0, overlap: float = DEFAULT_OVERLAP,
             classes: int | None = None) -> Dataset:
    """A synthetic knowledge base: `n_tickets` tickets, `n_queries` queries with ~10 graded pairs each.

    Deterministic for `seed`; the tickets do not depend on `n_queries`. `overlap` is the chance that a word
    form comes from the other register (higher = easier for word overlap). `classes`: how many problem classes
    the tickets are drawn from (default a third of `n_tickets`, so each class holds ~3 tickets; at most 630);
    fewer make a help desk whose tickets recur in large clusters of one problem. A ticket's metadata names its
    class (`archetype`, `cause`).
    """
    if n_tickets < 1 or n_queries < 0:
        raise InputError(f"need at least 1 ticket and 0 or more queries, not {n_tickets} and {n_queries}")
    if not 0.0 <= overlap <= 1.0:
        raise InputError(f"overlap must lie in [0, 1], not {overlap}")
    if classes is not None and classes < 1:
        raise InputError(f"need at least 1 problem class, not {classes}")
    pick = random.Random(f"{seed}:classes")
    every = problem_classes()
    active = pick.sample(every, min(len(every), classes if classes is not None else max(1, n_tickets // 3)))
    rng_t = random.Random(f"{seed}:tickets")
    ticket_writer = _Writer(rng_t, 0, overlap)
    tickets, ticket_class = [], []
    for i in range(n_tickets):
        cls = active[i % len(active)] if i < len(active) else rng_t.choice(active)
        tickets.append(_ticket(rng_t, ticket_writer, cls, f"T{i + 1:06d}"))
        ticket_class.append(cls)
    by_class: dict[ProblemClass, list[int]] = {}
    by_subsystem: dict[str, list[int]] = {}
    for i, cls in enumerate(ticket_class):
        by_class.setdefault(cls, []).append(i)
        by_subsystem.setdefault(cls.subsystem, []).append(i)

    rng_q = random.Random(f"{seed}:queries")
    query_writer = _Writer(rng_q, 1, overlap)
    queries, pairs = [], []
    for j in range(n_queries):
        cls = ticket_class[rng_q.randrange(n_tickets)]
        qid = f"Q{j + 1:05d}"
        queries.append(_query(rng_q, query_writer, cls, qid))
        same = by_class[cls]
        yes = rng_q.sample(same, min(MAX_YES, len(same)))
        rel_pool = [i for i in by_subsystem[cls.subsystem] if ticket_class[i] != cls]
        rel = rng_q.sample(rel_pool, min(N_REL, len(rel_pool)))
        no: list[int] = []
        for _ in range(N_NO * 10):  # rejection sampling: the KB is mostly other subsystems
            if len(no) == N_NO:
                break
            i = rng_q.randrange(n_tickets)
            if ticket_class[i].subsystem != cls.subsystem and i not in no:
                no.append(i)
        pairs += [LabeledPair(qid, tickets[i].id, YES) for i in yes]
        pairs += [LabeledPair(qid, tickets[i].id, REL) for i in rel]
        pairs += [LabeledPair(qid, tickets[i].id, NO) for i in no]
    return Dataset(tickets, queries, pairs, source=f"synthetic(seed={seed}, tickets={n_tickets}, queries={n_queries})")


def write_jsonl(dataset: Dataset, path: str | Path) -> Path:
    """Write `dataset` as ticketrec JSONL (tickets, queries, pairs) atomically: a temp file, then rename."""
    from .exporters import iter_records

    path = Path(path)
    with atomic_file(path, "w") as out:
        for record in iter_records(dataset):
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path
